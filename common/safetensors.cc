#include "common/safetensors.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/status.h"

namespace downpour {
namespace {

constexpr char kMetadataKey[] = "__metadata__";
// A header larger than this is taken as damage, not as a request to read it.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

void AppendJsonString(absl::string_view s, std::string* out) {
  out->push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppend(out, "\\u00", absl::string_view("0123456789abcdef" + ((c >> 4) & 0xf), 1),
                          absl::string_view("0123456789abcdef" + (c & 0xf), 1));
        } else {
          out->push_back(c);
        }
    }
  }
  out->push_back('"');
}

// The JSON the header holds: objects, arrays, strings and integers (the
// format has nothing else; any other value is an error).
struct Json {
  enum class Kind { kObject, kArray, kString, kNumber } kind = Kind::kNumber;
  std::vector<std::pair<std::string, Json>> members;  // kObject, in file order.
  std::vector<Json> items;                            // kArray.
  std::string string;                                 // kString.
  int64_t number = 0;                                 // kNumber.
};

class JsonParser {
 public:
  explicit JsonParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Json> ParseDocument() {
    ASSIGN_OR_RETURN(Json value, ParseValue(0));
    SkipSpace();
    if (at_ != text_.size()) return Error("trailing characters");
    return value;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(what, " at header byte ", at_));
  }
  void SkipSpace() {
    while (at_ < text_.size() && absl::ascii_isspace(static_cast<unsigned char>(text_[at_]))) ++at_;
  }
  bool Consume(char c) {
    SkipSpace();
    if (at_ < text_.size() && text_[at_] == c) {
      ++at_;
      return true;
    }
    return false;
  }

  absl::StatusOr<Json> ParseValue(int depth) {
    if (depth > 8) return Error("nesting too deep");
    SkipSpace();
    if (at_ >= text_.size()) return Error("unexpected end");
    const char c = text_[at_];
    Json value;
    if (c == '{') {
      ++at_;
      value.kind = Json::Kind::kObject;
      if (Consume('}')) return value;
      do {
        SkipSpace();
        ASSIGN_OR_RETURN(std::string key, ParseString());
        if (!Consume(':')) return Error("expected ':'");
        ASSIGN_OR_RETURN(Json member, ParseValue(depth + 1));
        value.members.emplace_back(std::move(key), std::move(member));
      } while (Consume(','));
      if (!Consume('}')) return Error("expected '}'");
      return value;
    }
    if (c == '[') {
      ++at_;
      value.kind = Json::Kind::kArray;
      if (Consume(']')) return value;
      do {
        ASSIGN_OR_RETURN(Json item, ParseValue(depth + 1));
        value.items.push_back(std::move(item));
      } while (Consume(','));
      if (!Consume(']')) return Error("expected ']'");
      return value;
    }
    if (c == '"') {
      value.kind = Json::Kind::kString;
      ASSIGN_OR_RETURN(value.string, ParseString());
      return value;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      const bool negative = c == '-';
      if (negative) ++at_;
      const size_t start = at_;
      uint64_t n = 0;
      while (at_ < text_.size() && text_[at_] >= '0' && text_[at_] <= '9') {
        const uint64_t digit = static_cast<uint64_t>(text_[at_] - '0');
        if (n > (std::numeric_limits<uint64_t>::max() / 2 - digit) / 10) {
          return Error("number out of range");
        }
        n = n * 10 + digit;
        ++at_;
      }
      if (at_ == start) return Error("expected a digit");
      if (at_ < text_.size() && (text_[at_] == '.' || text_[at_] == 'e' || text_[at_] == 'E')) {
        return Error("expected an integer");
      }
      value.number = negative ? -static_cast<int64_t>(n) : static_cast<int64_t>(n);
      return value;
    }
    return Error("expected a value");
  }

  absl::StatusOr<std::string> ParseString() {
    if (at_ >= text_.size() || text_[at_] != '"') return Error("expected a string");
    ++at_;
    std::string out;
    while (at_ < text_.size() && text_[at_] != '"') {
      char c = text_[at_++];
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (at_ >= text_.size()) return Error("unterminated escape");
      c = text_[at_++];
      switch (c) {
        case '"':
        case '\\':
        case '/':
          out.push_back(c);
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'u': {
          if (at_ + 4 > text_.size()) return Error("short \\u escape");
          unsigned code = 0;
          for (int i = 0; i < 4; ++i) {
            const char h = text_[at_++];
            code <<= 4;
            if (h >= '0' && h <= '9') {
              code |= h - '0';
            } else if (h >= 'a' && h <= 'f') {
              code |= h - 'a' + 10;
            } else if (h >= 'A' && h <= 'F') {
              code |= h - 'A' + 10;
            } else {
              return Error("bad \\u escape");
            }
          }
          // UTF-8 of a code point of the basic plane (names are ASCII in
          // practice; surrogate pairs are kept as two code points).
          if (code < 0x80) {
            out.push_back(static_cast<char>(code));
          } else if (code < 0x800) {
            out.push_back(static_cast<char>(0xc0 | (code >> 6)));
            out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
          } else {
            out.push_back(static_cast<char>(0xe0 | (code >> 12)));
            out.push_back(static_cast<char>(0x80 | ((code >> 6) & 0x3f)));
            out.push_back(static_cast<char>(0x80 | (code & 0x3f)));
          }
          break;
        }
        default:
          return Error("bad escape");
      }
    }
    if (at_ >= text_.size()) return Error("unterminated string");
    ++at_;
    return out;
  }

  const absl::string_view text_;
  size_t at_ = 0;
};

uint64_t DecodeU64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

}  // namespace

const char* TensorDtypeName(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF32:
      return "F32";
    case TensorDtype::kF64:
      return "F64";
    case TensorDtype::kF16:
      return "F16";
    case TensorDtype::kBF16:
      return "BF16";
    case TensorDtype::kI64:
      return "I64";
    case TensorDtype::kI32:
      return "I32";
    case TensorDtype::kU8:
      return "U8";
  }
  return "?";
}

absl::StatusOr<TensorDtype> ParseTensorDtype(absl::string_view name) {
  for (TensorDtype d : {TensorDtype::kF32, TensorDtype::kF64, TensorDtype::kF16, TensorDtype::kBF16,
                        TensorDtype::kI64, TensorDtype::kI32, TensorDtype::kU8}) {
    if (name == TensorDtypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", name, "\""));
}

int TensorDtypeBytes(TensorDtype dtype) {
  switch (dtype) {
    case TensorDtype::kF64:
    case TensorDtype::kI64:
      return 8;
    case TensorDtype::kF32:
    case TensorDtype::kI32:
      return 4;
    case TensorDtype::kF16:
    case TensorDtype::kBF16:
      return 2;
    case TensorDtype::kU8:
      return 1;
  }
  return 0;
}

namespace {

// The header (length and JSON, padded) of a file of `tensors`, and each
// tensor's byte size; `where` names the file in errors.
absl::StatusOr<std::string> EncodeHeader(const std::vector<TensorToWrite>& tensors,
                                         const std::map<std::string, std::string>& metadata,
                                         absl::string_view where, std::vector<uint64_t>* sizes) {
  std::string header = "{";
  if (!metadata.empty()) {
    AppendJsonString(kMetadataKey, &header);
    header.append(":{");
    bool first = true;
    for (const auto& [key, value] : metadata) {
      if (!first) header.push_back(',');
      first = false;
      AppendJsonString(key, &header);
      header.push_back(':');
      AppendJsonString(value, &header);
    }
    header.push_back('}');
  }
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("safetensors ", where, ": tensor name \"",
                                                     t.name, "\" is empty, reserved or repeated"));
    }
    uint64_t elements = 1;
    for (int64_t d : t.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors ", where, ": tensor ", t.name, " has a negative dimension"));
      }
      elements *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = elements * static_cast<uint64_t>(TensorDtypeBytes(t.dtype));
    if (header.size() > 1) header.push_back(',');
    AppendJsonString(t.name, &header);
    absl::StrAppend(&header, ":{\"dtype\":\"", TensorDtypeName(t.dtype), "\",\"shape\":[");
    for (size_t i = 0; i < t.shape.size(); ++i) absl::StrAppend(&header, i ? "," : "", t.shape[i]);
    absl::StrAppend(&header, "],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
    sizes->push_back(bytes);
  }
  header.push_back('}');
  // Padded with spaces so the data start 8-byte aligned.
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header;
}

}  // namespace

absl::StatusOr<std::string> SerializeSafetensors(
    const std::vector<TensorToWrite>& tensors, const std::map<std::string, std::string>& metadata) {
  std::vector<uint64_t> sizes;
  ASSIGN_OR_RETURN(std::string out, EncodeHeader(tensors, metadata, "bytes", &sizes));
  for (size_t i = 0; i < tensors.size(); ++i) {
    out.append(static_cast<const char*>(tensors[i].data), sizes[i]);
  }
  return out;
}

absl::StatusOr<WrittenFile> WriteSafetensors(const std::string& path,
                                             const std::vector<TensorToWrite>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  std::vector<uint64_t> sizes;
  ASSIGN_OR_RETURN(const std::string header, EncodeHeader(tensors, metadata, path, &sizes));
  uint64_t data_bytes = 0;
  for (uint64_t size : sizes) data_bytes += size;
  ASSIGN_OR_RETURN(
      std::unique_ptr<AtomicFile> file,
      AtomicFile::Create(path, "safetensors file",
                         data_bytes >= kUncachedFileBytes ? AtomicFile::Caching::kBypass
                                                          : AtomicFile::Caching::kPageCache));
  RETURN_IF_ERROR(file->Append(header));
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (sizes[i] == 0) continue;
    RETURN_IF_ERROR(
        file->Append(absl::string_view(static_cast<const char*>(tensors[i].data), sizes[i])));
  }
  RETURN_IF_ERROR(file->Commit());
  return WrittenFile{file->bytes(), file->crc32c()};
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return Parse(std::move(bytes), path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Parse(std::string bytes, std::string name) {
  auto damaged = [&name](absl::string_view what) {
    return absl::DataLossError(absl::StrCat("safetensors file ", name, " is damaged: ", what));
  };
  if (bytes.size() < 8) return damaged("shorter than its 8-byte header length");
  const uint64_t header_bytes = DecodeU64(bytes.data());
  if (header_bytes > kMaxHeaderBytes || 8 + header_bytes > bytes.size()) {
    return damaged(
        absl::StrCat("header length ", header_bytes, " does not fit its ", bytes.size(), " bytes"));
  }
  absl::StatusOr<Json> header =
      JsonParser(absl::string_view(bytes.data() + 8, header_bytes)).ParseDocument();
  if (!header.ok()) return damaged(header.status().message());
  if (header->kind != Json::Kind::kObject) return damaged("header is not a JSON object");

  SafetensorsFile file;
  file.name_ = name;
  auto shared = std::make_shared<std::string>(std::move(bytes));
  const char* data = shared->data() + 8 + header_bytes;
  const uint64_t data_bytes = shared->size() - 8 - header_bytes;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [key, value] : header->members) {
    if (key == kMetadataKey) {
      if (value.kind != Json::Kind::kObject) return damaged("__metadata__ is not an object");
      for (const auto& [k, v] : value.members) {
        if (v.kind != Json::Kind::kString) return damaged("__metadata__ values must be strings");
        file.metadata_[k] = v.string;
      }
      continue;
    }
    const Json* dtype = nullptr;
    const Json* shape = nullptr;
    const Json* offsets = nullptr;
    if (value.kind == Json::Kind::kObject) {
      for (const auto& [field, v] : value.members) {
        if (field == "dtype") dtype = &v;
        if (field == "shape") shape = &v;
        if (field == "data_offsets") offsets = &v;
      }
    }
    if (dtype == nullptr || dtype->kind != Json::Kind::kString || shape == nullptr ||
        shape->kind != Json::Kind::kArray || offsets == nullptr ||
        offsets->kind != Json::Kind::kArray || offsets->items.size() != 2) {
      return damaged(absl::StrCat("tensor \"", key, "\" lacks dtype, shape or data_offsets"));
    }
    Tensor tensor;
    absl::StatusOr<TensorDtype> parsed = ParseTensorDtype(dtype->string);
    if (!parsed.ok())
      return damaged(absl::StrCat("tensor \"", key, "\": ", parsed.status().message()));
    tensor.dtype = *parsed;
    uint64_t elements = 1;
    for (const Json& d : shape->items) {
      if (d.kind != Json::Kind::kNumber || d.number < 0 || d.number > (int64_t{1} << 40)) {
        return damaged(absl::StrCat("tensor \"", key, "\" has a bad dimension"));
      }
      tensor.shape.push_back(d.number);
      elements *= static_cast<uint64_t>(d.number);
      if (elements > (uint64_t{1} << 50))
        return damaged(absl::StrCat("tensor \"", key, "\" is too large"));
    }
    const Json& begin = offsets->items[0];
    const Json& end = offsets->items[1];
    if (begin.kind != Json::Kind::kNumber || end.kind != Json::Kind::kNumber || begin.number < 0 ||
        end.number < begin.number || static_cast<uint64_t>(end.number) > data_bytes) {
      return damaged(absl::StrCat("tensor \"", key, "\" has data offsets outside the file"));
    }
    const uint64_t length = static_cast<uint64_t>(end.number - begin.number);
    if (length != elements * static_cast<uint64_t>(TensorDtypeBytes(tensor.dtype))) {
      return damaged(absl::StrCat("tensor \"", key, "\" has ", length, " bytes for its shape's ",
                                  elements, " ", TensorDtypeName(tensor.dtype), " elements"));
    }
    tensor.data = absl::string_view(data + begin.number, length);
    ranges.emplace_back(begin.number, end.number);
    if (!file.tensors_.emplace(key, std::move(tensor)).second) {
      return damaged(absl::StrCat("tensor \"", key, "\" appears twice"));
    }
  }
  // The tensors tile the data: no gap, no overlap, nothing after them.
  std::sort(ranges.begin(), ranges.end());
  uint64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin != covered) return damaged("tensors' data overlap or leave a gap");
    covered = end;
  }
  if (covered != data_bytes) {
    return damaged(absl::StrCat(data_bytes - covered, " bytes after the last tensor"));
  }
  file.bytes_ = std::move(shared);
  return file;
}

absl::StatusOr<SafetensorsFile::Tensor> SafetensorsFile::Get(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("safetensors file ", name_, " has no tensor ", name));
  }
  return it->second;
}

absl::StatusOr<const float*> SafetensorsFile::Floats(const std::string& name,
                                                     int64_t elements) const {
  ASSIGN_OR_RETURN(Tensor tensor, Get(name));
  if (tensor.dtype != TensorDtype::kF32 ||
      tensor.data.size() != static_cast<size_t>(elements) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors file ", name_, ": tensor ", name, " is ", tensor.data.size(), " bytes of ",
        TensorDtypeName(tensor.dtype), ", not ", elements, " F32 elements"));
  }
  // The data start 8-byte aligned (WriteSafetensors pads the header), and
  // std::string's buffer is at least as aligned; a file written elsewhere may
  // not be, so fall back to callers copying when it is not.
  if (reinterpret_cast<uintptr_t>(tensor.data.data()) % alignof(float) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors file ", name_, ": tensor ", name, " is not 4-byte aligned"));
  }
  return reinterpret_cast<const float*>(tensor.data.data());
}

}  // namespace downpour
