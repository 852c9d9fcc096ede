// atomic_file: files written whole or not at all. A reader (or a restart after a crash) sees
// either the old file or the new one, never a half-written one: the bytes go to a temporary
// beside the target, are flushed to the disk, and the temporary is renamed over the target.
#pragma once

#include <cstddef>
#include <string>

namespace pipetrain {

/// Writes `size` bytes to `path` (created or truncated), flushed to the disk (fsync) before it
/// returns. Throws IoError naming the path and the system's reason.
void write_file_synced(const std::string& path, const void* data, size_t size);

/// Flushes a directory's entries (a file created or renamed in it) to the disk; IoError otherwise.
void fsync_directory(const std::string& dir);

/// Replaces `path` with `size` bytes whole or not at all: they are written to `path` +
/// ".partial" and synced, then renamed over `path`. On failure the partial file is removed, what
/// was at `path` stays as it was, and IoError names the path and the system's reason.
void write_file_atomically(const std::string& path, const void* data, size_t size);
/// The same for text.
inline void write_file_atomically(const std::string& path, const std::string& text) {
  write_file_atomically(path, text.data(), text.size());
}

}  // namespace pipetrain
