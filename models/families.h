// The built-in families. Each is one file; registry.cpp lists them.
#pragma once

#include "models/model.h"

namespace pipetrain::models {

Model build_mlp(JsonReader& model);
Model build_cnn(JsonReader& model);
Model build_gpt(JsonReader& model);
Model build_unet(JsonReader& model);
/// `layers`: the network as a list of named layers (layer_list.cpp).
Model build_layer_list(JsonReader& model);
/// `torchscript`: an nn.Sequential saved from Python, split by its children (torchscript.cpp).
Model build_torchscript(JsonReader& model);

}  // namespace pipetrain::models
