// Every layer, the Module base, initialization and the built-in models in one include.
#pragma once

#include "lockstep/nn/activation.h"
#include "lockstep/nn/conv.h"
#include "lockstep/nn/dropout.h"
#include "lockstep/nn/embedding.h"
#include "lockstep/nn/flatten.h"
#include "lockstep/nn/gpt.h"
#include "lockstep/nn/init.h"
#include "lockstep/nn/linear.h"
#include "lockstep/nn/models.h"
#include "lockstep/nn/module.h"
#include "lockstep/nn/normalization.h"
#include "lockstep/nn/resnet.h"
#include "lockstep/nn/sequential.h"
