// Cross-entropy over the last dimension without a full-size float32 copy of the logits: rows in
// chunks, each widened to float32 (float64 stays float64), its log-sum-exp kept (one value per
// row) and the log-softmax never stored; the backward recomputes each chunk's softmax from the
// logits and those values. For a language model's large vocabulary, where
// cross_entropy's saved log-softmax (and, under autocast, the float32 copy of bfloat16 logits)
// is as large as the logits themselves. Equal to the plain loss and gradient to rounding
// (CrossEntropy.* in tests/engine_parts_test.cpp). Targets are class ids in [0, classes).
#pragma once

#include <cstdint>

#include <ATen/core/Tensor.h>

namespace pipetrain::job {

/// The mean over rows of -log softmax(logits)[target], logits [..., C] and target [...];
/// `chunk_bytes` bounds each chunk's widened copy.
at::Tensor chunked_cross_entropy(const at::Tensor& logits, const at::Tensor& target, int64_t chunk_bytes = 16 << 20);

/// The class count from which mean_cross_entropy (job.h) takes the chunked path.
constexpr int64_t kChunkedCrossEntropyClasses = 4096;

}  // namespace pipetrain::job
