// Reads back the event files of control/tensorboard_writer.h in tests,
// checking TFRecord's framing as TensorFlow does. Test-only.
#ifndef DOWNPOUR_CONTROL_TENSORBOARD_EVENTS_H_
#define DOWNPOUR_CONTROL_TENSORBOARD_EVENTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "proto/tensorboard_event.pb.h"

namespace downpour {
namespace control {

inline uint64_t ReadLittleEndian(const std::string& bytes, size_t at, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= uint64_t{static_cast<uint8_t>(bytes[at + i])} << (8 * i);
  return v;
}

// The events of one file, checking TFRecord's framing as TensorFlow does.
inline std::vector<tensorboard::Event> ReadEvents(const std::string& path) {
  std::vector<tensorboard::Event> events;
  absl::StatusOr<std::string> bytes = ReadFileToString(path);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  if (!bytes.ok()) return events;
  size_t at = 0;
  while (at < bytes->size()) {
    EXPECT_LE(at + 12, bytes->size()) << "torn header in " << path;
    if (at + 12 > bytes->size()) break;
    const uint64_t length = ReadLittleEndian(*bytes, at, 8);
    EXPECT_EQ(ReadLittleEndian(*bytes, at + 8, 4), MaskCrc(Crc32c(bytes->data() + at, 8)));
    EXPECT_LE(at + 16 + length, bytes->size()) << "torn record in " << path;
    if (at + 16 + length > bytes->size()) break;
    const std::string payload = bytes->substr(at + 12, length);
    EXPECT_EQ(ReadLittleEndian(*bytes, at + 12 + length, 4),
              MaskCrc(Crc32c(payload.data(), payload.size())));
    tensorboard::Event event;
    EXPECT_TRUE(event.ParseFromString(payload));
    events.push_back(event);
    at += 16 + length;
  }
  return events;
}

// (tag, step, value) of each scalar event after the file_version one.
struct Point {
  std::string tag;
  int64_t step;
  float value;
};
inline std::vector<Point> Scalars(const std::vector<tensorboard::Event>& events) {
  std::vector<Point> points;
  for (size_t i = 1; i < events.size(); ++i) {
    EXPECT_EQ(events[i].summary().value_size(), 1);
    const auto& v = events[i].summary().value(0);
    points.push_back({v.tag(), events[i].step(), v.simple_value()});
  }
  return points;
}

}  // namespace control
}  // namespace downpour

#endif  // DOWNPOUR_CONTROL_TENSORBOARD_EVENTS_H_
