// The built-in families. Each is one file; registry.cpp lists them.
#pragma once

#include "models/model.h"

namespace pipetrain::models {

Model build_mlp(JsonReader& model);
Model build_cnn(JsonReader& model);
Model build_gpt(JsonReader& model);
Model build_unet(JsonReader& model);

}  // namespace pipetrain::models
