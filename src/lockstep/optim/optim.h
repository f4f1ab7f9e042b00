// The optimizers, LR schedules and gradient clipping in one include.
#pragma once

#include "lockstep/optim/adamw.h"
#include "lockstep/optim/clip_grad_norm.h"
#include "lockstep/optim/optimizer.h"
#include "lockstep/optim/schedule.h"
#include "lockstep/optim/sgd.h"
