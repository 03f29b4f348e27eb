#include "client/output.h"

#include <algorithm>
#include <cstdint>
#include <iostream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/util/json_util.h"

namespace downpour {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;
using google::protobuf::Reflection;

// A scalar field's value (element `index` of a repeated one, or -1) as YAML.
std::string YamlScalar(const Message& message, const FieldDescriptor* field, int index) {
  const Reflection* r = message.GetReflection();
  const bool rep = index >= 0;
  switch (field->cpp_type()) {
    case FieldDescriptor::CPPTYPE_INT32:
      return absl::StrCat(rep ? r->GetRepeatedInt32(message, field, index)
                              : r->GetInt32(message, field));
    case FieldDescriptor::CPPTYPE_INT64:
      return absl::StrCat(rep ? r->GetRepeatedInt64(message, field, index)
                              : r->GetInt64(message, field));
    case FieldDescriptor::CPPTYPE_UINT32:
      return absl::StrCat(rep ? r->GetRepeatedUInt32(message, field, index)
                              : r->GetUInt32(message, field));
    case FieldDescriptor::CPPTYPE_UINT64:
      return absl::StrCat(rep ? r->GetRepeatedUInt64(message, field, index)
                              : r->GetUInt64(message, field));
    case FieldDescriptor::CPPTYPE_FLOAT:
      return absl::StrCat(rep ? r->GetRepeatedFloat(message, field, index)
                              : r->GetFloat(message, field));
    case FieldDescriptor::CPPTYPE_DOUBLE:
      return absl::StrCat(rep ? r->GetRepeatedDouble(message, field, index)
                              : r->GetDouble(message, field));
    case FieldDescriptor::CPPTYPE_BOOL:
      return (rep ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field))
                 ? "true"
                 : "false";
    case FieldDescriptor::CPPTYPE_ENUM:
      return (rep ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field))->name();
    case FieldDescriptor::CPPTYPE_STRING: {
      const std::string value =
          rep ? r->GetRepeatedString(message, field, index) : r->GetString(message, field);
      // YAML's double-quoted style takes C escapes.
      if (field->type() == FieldDescriptor::TYPE_BYTES) {
        return absl::StrCat("\"", absl::Base64Escape(value), "\"");
      }
      return absl::StrCat("\"", absl::CEscape(value), "\"");
    }
    case FieldDescriptor::CPPTYPE_MESSAGE:
      break;
  }
  return "";
}

void AppendYaml(const Message& message, int indent, std::string* out) {
  const std::string pad(indent, ' ');
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const Reflection* r = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    const bool is_message = field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE;
    if (field->is_repeated()) {
      const int n = r->FieldSize(message, field);
      if (n == 0) {
        absl::StrAppend(out, pad, field->name(), ": []\n");
        continue;
      }
      absl::StrAppend(out, pad, field->name(), ":\n");
      for (int k = 0; k < n; ++k) {
        if (!is_message) {
          absl::StrAppend(out, pad, "- ", YamlScalar(message, field, k), "\n");
          continue;
        }
        std::string item;
        AppendYaml(r->GetRepeatedMessage(message, field, k), indent + 2, &item);
        if (item.empty()) {
          absl::StrAppend(out, pad, "- {}\n");
        } else {
          // The first key goes on the dash's line.
          item.replace(indent, 2, "- ");
          absl::StrAppend(out, item);
        }
      }
    } else if (is_message) {
      if (!r->HasField(message, field)) {
        absl::StrAppend(out, pad, field->name(), ": null\n");
        continue;
      }
      std::string inner;
      AppendYaml(r->GetMessage(message, field), indent + 2, &inner);
      absl::StrAppend(out, pad, field->name(), inner.empty() ? ": {}\n" : ":\n", inner);
    } else {
      absl::StrAppend(out, pad, field->name(), ": ", YamlScalar(message, field, -1), "\n");
    }
  }
}

}  // namespace

absl::StatusOr<OutputFormat> ParseOutputFormat(const std::string& text) {
  if (text == "table") return OutputFormat::kTable;
  if (text == "wide") return OutputFormat::kWide;
  if (text == "json") return OutputFormat::kJson;
  if (text == "yaml") return OutputFormat::kYaml;
  return absl::InvalidArgumentError(absl::StrCat(
      "output format '", text, "' is unknown; use -o table, -o wide, -o json or -o yaml"));
}

std::string ToJson(const Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string json;
  // Only fails for Any or other well-known types, which these messages do
  // not hold.
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  while (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

std::string ToYaml(const Message& message, int indent) {
  std::string out;
  AppendYaml(message, indent, &out);
  return out;
}

void PrintMessage(const Message& message, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    std::cout << ToYaml(message) << std::flush;
  } else {
    std::cout << ToJson(message) << std::endl;
  }
}

void PrintMessageList(const std::vector<const Message*>& messages, OutputFormat format) {
  if (format == OutputFormat::kYaml) {
    if (messages.empty()) std::cout << "[]\n";
    for (const Message* m : messages) {
      std::string item = ToYaml(*m, 2);
      if (item.size() >= 2) item.replace(0, 2, "- ");
      std::cout << (item.empty() ? "- {}\n" : item);
    }
    std::cout.flush();
    return;
  }
  std::vector<std::string> items;
  items.reserve(messages.size());
  for (const Message* m : messages) items.push_back(ToJson(*m));
  std::cout << "[" << (items.empty() ? "" : "\n") << absl::StrJoin(items, ",\n") << "]"
            << std::endl;
}

void PrintTable(const std::vector<std::string>& header,
                const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto print_row = [&](const std::vector<std::string>& row) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
    }
    std::cout << line << "\n";
  };
  print_row(header);
  for (const auto& row : rows) print_row(row);
  std::cout.flush();
}

std::string FormatShortDuration(absl::Duration d) {
  int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s < 60) return absl::StrFormat("%ds", s);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, s % 3600 / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, s % 86400 / 3600);
}

std::string Ago(int64_t time_ms, int64_t now_ms) {
  if (time_ms <= 0) return "-";
  return absl::StrCat(FormatShortDuration(absl::Milliseconds(now_ms - time_ms)), " ago");
}

}  // namespace downpour
