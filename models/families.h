// The built-in families. Each is one file; registry.cpp lists them.
#pragma once

#include "models/model.h"

namespace pipetrain::models {

Model build_mlp(JsonReader& model);
Model build_cnn(JsonReader& model);
/// The standard deviation a tied gpt's token embedding (and so its head) starts with (GPT-2's).
constexpr double kTiedEmbeddingStd = 0.02;
Model build_gpt(JsonReader& model);
Model build_unet(JsonReader& model);
/// A user's network's input, declared once: `input_shape` (one sample's, without the batch) and
/// `input_dtype` ("float", or "long" for token ids), into m.sample_shape and m.token_input.
void read_input(JsonReader& model, Model& m);
/// `layers`: the network as a list of named layers (layer_list.cpp).
Model build_layer_list(JsonReader& model);
/// The most parameter values (parameters and buffers, all layers) a layer list may build; a list
/// beyond it is refused, naming the layer where it crosses, before any tensor is made. By default
/// what this machine's memory holds in float32; a program that builds untrusted lists sets less.
void set_parameter_limit(double values);
double parameter_limit();
/// `torchscript`: an nn.Sequential saved from Python, split by its children (torchscript.cpp).
Model build_torchscript(JsonReader& model);

}  // namespace pipetrain::models
