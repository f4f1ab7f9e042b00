// Every op in one include.
#pragma once

#include "lockstep/autograd/grad_mode.h"
#include "lockstep/ops/batch_norm.h"
#include "lockstep/ops/conv.h"
#include "lockstep/ops/dropout.h"
#include "lockstep/ops/elementwise.h"
#include "lockstep/ops/embedding.h"
#include "lockstep/ops/linalg.h"
#include "lockstep/ops/loss.h"
#include "lockstep/ops/norm.h"
#include "lockstep/ops/random.h"
#include "lockstep/ops/reduce.h"
#include "lockstep/ops/shape_ops.h"
