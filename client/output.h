// How downpourctl prints: tables (plain and wide), JSON and YAML renderings
// of protobuf messages, and short durations. Stateless; thread-compatible.
#ifndef DOWNPOUR_CLIENT_OUTPUT_H_
#define DOWNPOUR_CLIENT_OUTPUT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"

namespace downpour {

// -o table (default), wide (a table with more columns), json, yaml.
enum class OutputFormat { kTable, kWide, kJson, kYaml };

// json and yaml: a command prints messages (PrintMessage), not a table.
inline bool PrintsMessages(OutputFormat format) {
  return format == OutputFormat::kJson || format == OutputFormat::kYaml;
}

// InvalidArgument naming the unknown format.
absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text);

// A message as JSON (proto field names, default values printed), no
// trailing newline.
std::string ToJson(const google::protobuf::Message& message);

// A message as a YAML mapping (proto field names, every field of a present
// message, enums by name, strings double-quoted, bytes in base64), each line
// indented by `indent` spaces, ending in a newline.
std::string ToYaml(const google::protobuf::Message& message, int indent = 0);

// One message in `format` (json or yaml) on stdout.
void PrintMessage(const google::protobuf::Message& message, OutputFormat format);

// A list of messages in `format` (json: an array; yaml: a sequence).
void PrintMessageList(const std::vector<const google::protobuf::Message*>& messages,
                      OutputFormat format);
template <typename Message>
void PrintMessages(const std::vector<Message>& messages, OutputFormat format) {
  std::vector<const google::protobuf::Message*> pointers;
  for (const Message& m : messages) pointers.push_back(&m);
  PrintMessageList(pointers, format);
}

// Left-aligned columns, two spaces apart, on stdout.
void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows);

// "45s", "1m05s", "2h03m", "3d04h".
std::string FormatShortDuration(absl::Duration d);

// "3m05s ago" from a time in Unix ms ("-" for 0).
std::string Ago(int64_t time_ms, int64_t now_ms);

}  // namespace downpour

#endif  // DOWNPOUR_CLIENT_OUTPUT_H_
