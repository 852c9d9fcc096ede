// The memory account of each thread (common/memory_account.h).
#include "common/memory_account.h"

namespace pipetrain {

int& memory_account() {
  thread_local int account = -1;
  return account;
}

}  // namespace pipetrain
