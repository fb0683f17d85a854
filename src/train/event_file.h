#pragma once
// TensorBoard's event file format, written and read without protobuf or
// TensorFlow: TFRecord framing (length, masked CRC32C of the length, payload,
// masked CRC32C of the payload) around `Event` protos, of which cqk writes four
// kinds: the file version header, a session start (a resume), scalars
// (Summary.Value.simple_value) and text for the text plugin (a string tensor).
// Field numbers follow
// tensorflow/core/util/event.proto and framework/summary.proto.
#include <cstdint>
#include <istream>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace cqk::event_file {

// CRC-32C (Castagnoli), and the rotated, offset form TFRecord stores.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

// One TFRecord around `payload`.
void write_record(std::ostream& out, const std::string& payload);

// The next record's payload; nullopt at a clean end of the stream. Throws
// std::runtime_error naming what is wrong for a truncated record or a CRC mismatch.
std::optional<std::string> read_record(std::istream& in);

// Serialised Event protos.
std::string file_version_event(double wall_time);
// SessionLog START at `step`: readers drop the events of earlier files from
// that step on (what a resumed run logs again replaces them).
std::string session_start_event(double wall_time, int64_t step);
std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars);
std::string text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text);

}  // namespace cqk::event_file
