// data.kind "tokens": a flat file of token ids for a language model, as nanoGPT's prepare scripts
// write them: a raw `.bin` of little-endian uint16 (data.dtype uint32 for a larger vocabulary, or uint8, int32, int64),
// or a 1-D `.npy` (uint8, uint16, uint32, int32 or int64, as its header says). The file is
// memory-mapped; a sample is a window of model.seq_len + 1 ids (input: the first seq_len, target:
// the same shifted by one), training windows every data.stride ids (default seq_len), shuffled
// per epoch from the seed as every data kind; test windows every seq_len ids (each test id
// predicted once) from data.test_path, or from the last data.test_fraction of the file. The whole
// file is read once at load: an id not below model.vocab_size (or a negative one) is a DataError
// naming the file, the byte offset and the id; the same pass counts the ids for the unigram
// baseline. Tests: tests/tokens_data_test.cpp.
#pragma once

#include <string>

#include "job/data.h"

namespace pipetrain::job {

Dataset load_tokens(const Config& c, const models::Model& model);

}  // namespace pipetrain::job
