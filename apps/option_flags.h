// The command line's spelling of the run options (common/option.h): one table, applied to every
// message the pipetrain command prints.
#pragma once

#include <string>

#include "common/option.h"

namespace pipetrain::apps {

/// The flag that sets `o` ("--set", "--checkpoint-dir", ...).
const char* flag_of(Option o);

/// `text` with every option marker spelled as its flag.
std::string with_flags(const std::string& text);

}  // namespace pipetrain::apps
