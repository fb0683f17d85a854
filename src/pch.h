// The one precompiled header: the torch headers nearly every unit needs.
// Narrow on purpose; <torch/torch.h> would double the parse time.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>
#include <torch/types.h>
#include <string>
#include <utility>
#include <vector>
