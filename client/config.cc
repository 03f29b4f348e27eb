#include "client/config.h"

#include <sys/stat.h>

#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/file.h"

namespace downpour {
namespace {

constexpr char kDefaultCoordinator[] = "127.0.0.1:7070";

// A value, its optional quotes removed.
std::string Unquote(absl::string_view value) {
  value = absl::StripAsciiWhitespace(value);
  if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
      value.back() == value.front()) {
    value = value.substr(1, value.size() - 2);
  }
  return std::string(value);
}

}  // namespace

const CtlContext* CtlConfig::Find(const std::string& name) const {
  for (const CtlContext& c : contexts) {
    if (c.name == name) return &c;
  }
  return nullptr;
}

std::string DefaultConfigPath(const char* xdg_config_home, const char* home) {
  if (xdg_config_home != nullptr && *xdg_config_home != '\0') {
    return absl::StrCat(xdg_config_home, "/downpour/config.yaml");
  }
  if (home != nullptr && *home != '\0') return absl::StrCat(home, "/.config/downpour/config.yaml");
  return "";
}

absl::StatusOr<CtlConfig> ParseCtlConfig(const std::string& text, const std::string& path) {
  CtlConfig config;
  bool in_contexts = false;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": ", what));
    };
    if (const size_t hash = line.find('#'); hash != absl::string_view::npos) {
      line = line.substr(0, hash);
    }
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    const bool indented = line.front() == ' ' || line.front() == '-';
    absl::string_view item = absl::StripAsciiWhitespace(line);
    const bool starts_item = absl::ConsumePrefix(&item, "- ");
    const size_t colon = item.find(':');
    if (colon == absl::string_view::npos) return error("expected KEY: VALUE");
    const std::string key(absl::StripAsciiWhitespace(item.substr(0, colon)));
    const std::string value = Unquote(item.substr(colon + 1));
    if (!indented) {
      in_contexts = false;
      if (key == "current-context") {
        config.current_context = value;
      } else if (key == "contexts") {
        in_contexts = true;
      } else {
        return error(absl::StrCat("unknown key '", key, "' (current-context, contexts)"));
      }
      continue;
    }
    if (!in_contexts) return error("an indented line outside contexts");
    if (starts_item) config.contexts.emplace_back();
    if (config.contexts.empty()) return error("a context must begin with '- name: NAME'");
    if (key == "name") {
      config.contexts.back().name = value;
    } else if (key == "coordinator") {
      config.contexts.back().coordinator = value;
    } else if (key == "tls_ca") {
      config.contexts.back().tls_ca = value;
    } else if (key == "tls_cert") {
      config.contexts.back().tls_cert = value;
    } else if (key == "tls_key") {
      config.contexts.back().tls_key = value;
    } else if (key == "token_file") {
      config.contexts.back().token_file = value;
    } else {
      return error(absl::StrCat("unknown context key '", key,
                                "' (name, coordinator, tls_ca, tls_cert, tls_key, token_file)"));
    }
  }
  for (const CtlContext& c : config.contexts) {
    if (c.name.empty()) return absl::InvalidArgumentError(path + ": a context has no name");
  }
  return config;
}

absl::StatusOr<CtlConfig> LoadCtlConfig(const std::string& path) {
  struct stat info;
  if (path.empty() || stat(path.c_str(), &info) != 0) return CtlConfig();
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  return ParseCtlConfig(*text, path);
}

std::string FormatCtlConfig(const CtlConfig& config) {
  std::string out = absl::StrCat("current-context: ", config.current_context, "\ncontexts:\n");
  for (const CtlContext& c : config.contexts) {
    absl::StrAppend(&out, "- name: ", c.name, "\n  coordinator: ", c.coordinator, "\n");
    for (const auto& [key, value] : {std::pair<const char*, const std::string&>{"tls_ca", c.tls_ca},
                                     {"tls_cert", c.tls_cert},
                                     {"tls_key", c.tls_key},
                                     {"token_file", c.token_file}}) {
      if (!value.empty()) absl::StrAppend(&out, "  ", key, ": ", value, "\n");
    }
  }
  return out;
}

absl::Status SaveCtlConfig(const std::string& path, const CtlConfig& config) {
  if (path.empty()) {
    return absl::InvalidArgumentError("no config file: set --config, $XDG_CONFIG_HOME or $HOME");
  }
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    absl::Status made = MakeDirs(path.substr(0, slash));
    if (!made.ok()) return made;
  }
  return WriteFileAtomically(path, FormatCtlConfig(config), "config file");
}

absl::StatusOr<std::string> ResolveCoordinator(const std::string& flag, const char* env,
                                               const std::string& context_flag,
                                               const CtlConfig& config, std::string* source) {
  if (!flag.empty()) {
    *source = "--coordinator";
    return flag;
  }
  if (!context_flag.empty()) {
    const CtlContext* context = config.Find(context_flag);
    if (context == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--context=", context_flag, ": no such context in the config file"));
    }
    *source = absl::StrCat("context ", context->name);
    return context->coordinator;
  }
  if (env != nullptr && *env != '\0') {
    *source = "DOWNPOUR_COORDINATOR";
    return std::string(env);
  }
  if (!config.current_context.empty()) {
    // A misspelt current-context must not quietly mean the default address.
    const CtlContext* current = config.Find(config.current_context);
    if (current == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("current-context ", config.current_context,
                       " is not among the config file's contexts; fix it with config use-context"));
    }
    *source = absl::StrCat("context ", current->name);
    return current->coordinator;
  }
  *source = "the default";
  return std::string(kDefaultCoordinator);
}

CtlContext ResolveSecurity(const CtlContext& flags, const std::string& source,
                           const CtlConfig& config) {
  CtlContext resolved = flags;
  absl::string_view name = source;
  const CtlContext* context =
      absl::ConsumePrefix(&name, "context ") ? config.Find(std::string(name)) : nullptr;
  if (context == nullptr) return resolved;
  for (auto [ours, theirs] : {std::pair{&resolved.tls_ca, &context->tls_ca},
                              {&resolved.tls_cert, &context->tls_cert},
                              {&resolved.tls_key, &context->tls_key},
                              {&resolved.token_file, &context->token_file}}) {
    if (ours->empty()) *ours = *theirs;
  }
  return resolved;
}

}  // namespace downpour
