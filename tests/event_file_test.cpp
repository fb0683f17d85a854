#include <gtest/gtest.h>

#include <sstream>
#include <stdexcept>

#include "train/event_file.h"

// TensorBoard's event format (tests/tensorboard_check.py reads whole runs with
// TensorBoard's own reader; these pin the pieces).
namespace {

namespace ef = cqk::event_file;

TEST(EventFile, Crc32cMatchesTheCastagnoliCheckValues) {
  // The CRC-32C check value (RFC 3720 B.4 and the CRC catalogue) and the iSCSI test vectors.
  EXPECT_EQ(ef::crc32c("123456789", 9), 0xE3069283u);
  const std::string zeros(32, '\0'), ones(32, '\xFF');
  EXPECT_EQ(ef::crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(ef::crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(ef::crc32c("", 0), 0u);
}

TEST(EventFile, RecordsReadBackAndDamageIsNamed) {
  std::stringstream stream;
  const std::string first = ef::scalars_event(1.5, 7, {{"train/loss", 2.25}});
  const std::string second = ef::text_event(2.5, 0, "config", "    a: 1\n");
  ef::write_record(stream, first);
  ef::write_record(stream, second);
  const std::string bytes = stream.str();
  EXPECT_EQ(bytes.size(), first.size() + second.size() + 2 * 16);

  std::istringstream in(bytes);
  EXPECT_EQ(ef::read_record(in), first);
  EXPECT_EQ(ef::read_record(in), second);
  EXPECT_EQ(ef::read_record(in), std::nullopt);

  std::istringstream torn(bytes.substr(0, bytes.size() - 3));
  ASSERT_EQ(ef::read_record(torn), first);
  EXPECT_THROW(ef::read_record(torn), std::runtime_error);

  std::string flipped = bytes;
  flipped[14] ^= 1;  // a payload byte of the first record
  std::istringstream corrupt(flipped);
  try {
    ef::read_record(corrupt);
    ADD_FAILURE() << "a flipped payload bit was not noticed";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("CRC"), std::string::npos) << e.what();
  }
}

// The session start's bytes: what TensorBoard's loader purges later steps on (event.proto SessionLog).
TEST(EventFile, SessionStartEventHasTheProtobufLayout) {
  const std::string expected = std::string("\x09", 1) + std::string(8, '\0') +  // wall_time = 0.0 (fixed64)
                               "\x10\x05" +                                    // step = 5
                               "\x3a\x02" +                                    // session_log, 2 bytes
                               "\x08\x01";                                     //   status = START
  EXPECT_EQ(ef::session_start_event(0.0, 5), expected);
}

// The scalar event's bytes, field by field (event.proto, summary.proto).
TEST(EventFile, ScalarEventHasTheProtobufLayout) {
  const std::string event = ef::scalars_event(0.0, 3, {{"t", 0.5}});
  const std::string expected = std::string("\x09", 1) + std::string(8, '\0') +  // wall_time = 0.0 (fixed64)
                               "\x10\x03" +                                    // step = 3
                               "\x2a\x0a" +                                    // summary, 10 bytes
                               "\x0a\x08" +                                    //   value, 8 bytes
                               "\x0a\x01t" +                                   //     tag "t"
                               std::string("\x15\x00\x00\x00\x3f", 5);         //     simple_value 0.5f
  EXPECT_EQ(event, expected);
}

}  // namespace
