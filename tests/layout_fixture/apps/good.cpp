// Allowed: apps/ may include any lower layer.
#include "train/trainer.h"
