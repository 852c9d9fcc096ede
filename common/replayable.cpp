#include "common/replayable.h"

namespace pipetrain {

namespace {
std::string& note() {
  thread_local std::string first;
  return first;
}
}  // namespace

void note_not_replayable(const char* why) {
  if (note().empty()) note() = why;
}

std::string take_not_replayable() {
  std::string out;
  out.swap(note());
  return out;
}

}  // namespace pipetrain
