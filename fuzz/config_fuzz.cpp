// The config reader and --set overrides. Input: the config's text, then NUL-separated --set
// texts. Every outcome is a parsed Config or a pipetrain::Error (a one-line ConfigError); any
// other exception, a crash or a sanitizer report is a bug.
#include "common/error.h"
#include "fuzz/config_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto c = pipetrain::fuzz::config_of(data, size);
    (void)c.where("train.steps");
  } catch (const pipetrain::Error&) {
  }
  return 0;
}
