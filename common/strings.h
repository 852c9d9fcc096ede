// Small string helpers used for user-facing messages.
#pragma once

#include <string>
#include <vector>

namespace pipetrain {

// Edit distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

// The candidate closest to `word`, or "" when none is reasonably close.
std::string nearest(const std::string& word, const std::vector<std::string>& candidates);

std::string join(const std::vector<std::string>& parts, const std::string& sep);

// `text` made safe for a one-line message: bytes outside printable ASCII become \xNN, and
// beyond `max` characters the rest is cut ("... (N bytes in all)").
std::string printable(const std::string& text, size_t max = 200);

}  // namespace pipetrain
