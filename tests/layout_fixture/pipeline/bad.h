// A file that breaks the layout rule, for the test that the rule is checked.
#pragma once
#include "train/trainer.h"
#include "comm/ucx/transport.h"
