// TensorBoard logs, written by pipetrain itself: an event file holds TFRecord records (the
// length, a masked CRC-32C of the length, the bytes, a masked CRC-32C of the bytes), each an
// Event protocol buffer — wall time, step, and a Summary of tagged float values — encoded by
// hand; that is all TensorBoard's scalar dashboard reads, so no protobuf library is needed.
// `train --tensorboard DIR` (train.tensorboard) writes one per run (rank 0 writes).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "train/trainer.h"

namespace pipetrain::train {

// CRC-32C (Castagnoli), as TFRecord frames use it.
uint32_t crc32c(const void* data, size_t n);

class EventWriter {
 public:
  // Creates `dir` if needed and a new event file in it (events.out.tfevents.<time>.<host>).
  explicit EventWriter(const std::string& dir);
  void scalar(const std::string& tag, int64_t step, double value);
  // Writes what is buffered and flushes the file (after every step: a run that dies keeps its log).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void record(const std::string& event);
  std::string path_;
  std::ofstream out_;
  std::string pending_;
};

// The scalars a user watches, from the trainer's reports: train/loss, train/lr,
// train/grad_norm, train/samples_per_s, train/step_time_s, train/loss_scale, stages/busy_ms/<r>,
// stages/bubble, memory/peak_mib/<r> (each device's peak: what its stage allocated in the
// step plus its parameters and optimizer state), and test/loss, test/accuracy (test/perplexity
// for a language model) at every evaluation and at the end.
class TensorBoardLog final : public TrainObserver {
 public:
  explicit TensorBoardLog(const std::string& dir) : writer_(dir) {}
  void stepped(const StepReport& r) override;
  void evaluated(int64_t step, const TrainResult& result) override;
  void tested(const TrainResult& result) override;
  const std::string& path() const { return writer_.path(); }

 private:
  void test_scalars(int64_t step, const TrainResult& result);
  EventWriter writer_;
};

}  // namespace pipetrain::train
