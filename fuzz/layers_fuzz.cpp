// The model section of a config as a layer list (models/layer_list.cpp): what users write by hand.
// Input: the config's text, then NUL-separated --set texts, as config_fuzz. A config that parses
// and names model.family "layers" is built, with the parameter limit lowered from the machine's
// memory to 16M values, so that a large model is refused rather than made. Every outcome is a
// built model or a pipetrain::Error (a one-line ConfigError); any other exception, a crash or a
// sanitizer report is a bug. (The built-in families are fixed networks with a few sizes, and
// "torchscript" reads a file: neither is built here.)
#include "common/error.h"
#include "fuzz/config_input.h"
#include "models/families.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pipetrain::models::set_parameter_limit(1 << 24);
  try {
    const auto c = pipetrain::fuzz::config_of(data, size);
    if (c.model.is_object() && c.model.contains("family") && c.model["family"] == "layers") {
      pipetrain::JsonReader model(c.model, "model", c.source, c.origins);
      (void)pipetrain::models::build(model, c.train.seed);
    }
  } catch (const pipetrain::Error&) {
  }
  return 0;
}
