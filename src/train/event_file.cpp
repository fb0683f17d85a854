#include "train/event_file.h"

#include <array>
#include <cstring>
#include <stdexcept>

namespace cqk::event_file {
namespace {

// The reflected CRC-32C table (polynomial 0x82F63B78), built once.
const std::array<uint32_t, 256>& crc_table() {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int bit = 0; bit < 8; ++bit) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

uint64_t get_little_endian(const std::string& in, size_t offset, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[offset + i])} << (8 * i);
  return value;
}

// --- protobuf wire format: the few field shapes an Event needs -----------------

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, (uint64_t{field} << 3) | type); }

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

// Event fields (event.proto) and Summary fields (summary.proto).
constexpr uint32_t kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5, kEventSessionLog = 7;
constexpr uint32_t kSessionLogStatus = 1;
constexpr uint64_t kSessionStart = 1;  // SessionLog.START
constexpr uint32_t kSummaryValue = 1;
constexpr uint32_t kValueTag = 1, kValueSimpleValue = 2, kValueTensor = 8, kValueMetadata = 9;
constexpr uint32_t kMetadataPluginData = 1, kPluginName = 1;
constexpr uint32_t kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr uint64_t kDtypeString = 7;  // types.proto DT_STRING

std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_key(event, kEventStep, kVarint);
  put_varint(event, static_cast<uint64_t>(step));
  return event;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  const auto& table = crc_table();
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ bytes[i]) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

void write_record(std::ostream& out, const std::string& payload) {
  std::string record;
  put_little_endian(record, payload.size(), 8);
  put_little_endian(record, masked_crc32c(record.data(), 8), 4);
  record += payload;
  put_little_endian(record, masked_crc32c(payload.data(), payload.size()), 4);
  out.write(record.data(), static_cast<std::streamsize>(record.size()));
}

std::optional<std::string> read_record(std::istream& in) {
  std::string header(12, '\0');
  in.read(header.data(), 12);
  if (in.gcount() == 0) return std::nullopt;
  if (in.gcount() < 12) throw std::runtime_error("truncated record header");
  if (get_little_endian(header, 8, 4) != masked_crc32c(header.data(), 8))
    throw std::runtime_error("record length fails its CRC");
  const uint64_t length = get_little_endian(header, 0, 8);
  std::string payload(length, '\0');
  in.read(payload.data(), static_cast<std::streamsize>(length));
  std::string footer(4, '\0');
  in.read(footer.data(), 4);
  if (in.gcount() < 4) throw std::runtime_error("truncated record");
  if (get_little_endian(footer, 0, 4) != masked_crc32c(payload.data(), payload.size()))
    throw std::runtime_error("record payload fails its CRC");
  return payload;
}

std::string file_version_event(double wall_time) {
  std::string event;
  put_double(event, kEventWallTime, wall_time);
  put_bytes(event, kEventFileVersion, "brain.Event:2");
  return event;
}

std::string session_start_event(double wall_time, int64_t step) {
  std::string session_log;
  put_key(session_log, kSessionLogStatus, kVarint);
  put_varint(session_log, kSessionStart);
  std::string event = event_header(wall_time, step);
  put_bytes(event, kEventSessionLog, session_log);
  return event;
}

std::string scalars_event(double wall_time, int64_t step, const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, kValueTag, tag);
    put_float(entry, kValueSimpleValue, static_cast<float>(value));
    put_bytes(summary, kSummaryValue, entry);
  }
  std::string event = event_header(wall_time, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

std::string text_event(double wall_time, int64_t step, const std::string& tag, const std::string& text) {
  std::string plugin_data, metadata, tensor, entry, summary;
  put_bytes(plugin_data, kPluginName, "text");
  put_bytes(metadata, kMetadataPluginData, plugin_data);
  put_key(tensor, kTensorDtype, kVarint);
  put_varint(tensor, kDtypeString);
  put_bytes(tensor, kTensorShape, "");  // rank 0
  put_bytes(tensor, kTensorStringVal, text);
  put_bytes(entry, kValueTag, tag);
  put_bytes(entry, kValueTensor, tensor);
  put_bytes(entry, kValueMetadata, metadata);
  put_bytes(summary, kSummaryValue, entry);
  std::string event = event_header(wall_time, step);
  put_bytes(event, kEventSummary, summary);
  return event;
}

}  // namespace cqk::event_file
