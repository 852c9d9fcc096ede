// A file that breaks the layout rule, for the test that the rule is checked.
#pragma once
#include "train/trainer.h"
#include "comm/ucx/transport.h"
inline int& calls() {
  thread_local int n = 0;  // one per compiler, not one per program
  return n;
}
