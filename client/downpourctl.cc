// downpourctl: the operator's command line over the Coordinator service, and
// the offline dataset importer and generator. See kUsage for the commands and
// client/commands.h for the exit status. This file parses the flags, picks
// the coordinator (client/config.h) and runs one command; config, version
// and completion live here too.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/commands.h"
#include "client/config.h"
#include "client/output.h"
#include "common/build_info.h"
#include "common/duration_flag.h"
#include "common/file.h"
#include "common/net_address.h"
#include "common/status.h"
#include "rpc/security.h"

ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of the coordinator (default: $DOWNPOUR_COORDINATOR, else the current "
          "context's, else 127.0.0.1:7070)");
ABSL_FLAG(std::string, context, "", "use this context of the config file for the coordinator");
ABSL_FLAG(std::string, config, "",
          "the config file of contexts (default $XDG_CONFIG_HOME/downpour/config.yaml or "
          "~/.config/downpour/config.yaml)");
ABSL_FLAG(std::string, tls_ca, "",
          "CA bundle of a coordinator that serves TLS (default: the context's tls_ca)");
ABSL_FLAG(std::string, tls_cert, "",
          "client certificate to prove who you are (with --tls_key; default: the context's)");
ABSL_FLAG(std::string, tls_key, "", "private key of --tls_cert");
ABSL_FLAG(std::string, token_file, "",
          "file holding your bearer token (default: $DOWNPOUR_TOKEN, else the context's "
          "token_file)");
ABSL_FLAG(std::string, output, "table", "output format: table, wide, json or yaml (-o for short)");
ABSL_FLAG(std::string, job_id, "", "submit: the new job's id (empty: the coordinator picks one)");
ABSL_FLAG(bool, wait, false,
          "submit, resume: wait for the job to end, like `wait`; checkpoint: wait until it is "
          "written");
ABSL_FLAG(std::string, init_from, "",
          "submit: start from saved weights: JOB or JOB@STEP (a checkpoint of a job this "
          "coordinator knows) or FILE.safetensors (an export, in either layout)");
ABSL_FLAG(std::string, model, "",
          "submit: the job's model from an ONNX file (the spec then holds only the training "
          "part; the job starts from the graph's weights)");
ABSL_FLAG(std::string, out, "",
          "export: the file to write, .safetensors (or .onnx with --format=onnx); the spec goes "
          "beside it");
ABSL_FLAG(int64_t, checkpoint, 0, "export: the checkpoint's step (0: the newest)");
ABSL_FLAG(std::string, layout, "pytorch",
          "export: pytorch (PyTorch's names and layouts) or native (ours)");
ABSL_FLAG(bool, follow, false, "logs: follow the log until the job ends (-f for short)");
ABSL_FLAG(bool, with_checkpoints, false,
          "delete: also remove the job's checkpoint files (under the coordinator's "
          "--checkpoint_root)");
ABSL_FLAG(int64_t, tail, 0, "logs: only the last N lines there are now (0: all kept)");
ABSL_FLAG(std::string, timeout, "0",
          "wait: give up after this long (e.g. 90s, 10m; a bare number is "
          "seconds; 0 = no limit)");
ABSL_FLAG(std::string, connect_timeout, "5s",
          "how long to wait for the coordinator to accept the connection");
ABSL_FLAG(std::string, reconnect_timeout, "30s",
          "wait: how long to keep trying to reach a coordinator that went "
          "away before giving up");
// Each command has its own default: idx (dataset import), safetensors (export).
ABSL_FLAG(std::string, format, "",
          "dataset import: input format (idx, the default); export: safetensors (the default) or "
          "onnx");
ABSL_FLAG(std::string, images, "", "dataset import: IDX images file");
ABSL_FLAG(std::string, labels, "", "dataset import: IDX labels file");
ABSL_FLAG(std::string, out_dir, "", "dataset import: directory the record shards are written to");
ABSL_FLAG(std::string, name, "", "dataset import: name of the data set (shard file prefix)");
ABSL_FLAG(std::string, fashion_mnist, "",
          "dataset import: directory holding Fashion-MNIST's IDX files "
          "(default /usr/share/datasets/fashion-mnist); imports train and "
          "test");
ABSL_FLAG(int32_t, shards, 1, "dataset import: number of record files");
ABSL_FLAG(int64_t, limit, 0, "dataset import: import at most this many examples (0 = all)");
ABSL_FLAG(std::string, kind, "", "dataset generate: what to generate (ctr)");
ABSL_FLAG(int64_t, examples, 1000000, "dataset generate: training examples");
ABSL_FLAG(int64_t, test_examples, 100000, "dataset generate: test examples");
ABSL_FLAG(uint64_t, seed, 1, "dataset generate: seed of the generating model and the draws");
ABSL_FLAG(double, zipf, 1.05, "dataset generate: skew s of the ids' Zipf law P(rank r) ~ r^-s");
ABSL_FLAG(std::string, vocabulary, "1000:10000000",
          "dataset generate: ids per sparse feature, MIN:MAX (spread geometrically over the "
          "features) or one value per feature, comma separated");
ABSL_FLAG(int32_t, sparse_features, 26, "dataset generate: sparse (int64 id) features C1..");
ABSL_FLAG(int32_t, dense_features, 13, "dataset generate: dense (float) features I1..");
ABSL_FLAG(int32_t, max_ids, 3,
          "dataset generate: most ids of a multi-valued sparse feature (C2, C4, ...)");
ABSL_FLAG(double, click_rate, 0.1, "dataset generate: the mean click probability");

namespace downpour {
namespace {

constexpr char kUsage[] =
    R"(usage: downpourctl [--coordinator=HOST:PORT | --context=NAME] [-o FORMAT] COMMAND [ARGS]

commands:
  nodes                 list shards and workers (status, when last heard)
  nodes drain NODE      NODE gets no new work; its running jobs move off it
  nodes uncordon NODE   NODE takes new work again
  submit FILE [--job_id=ID] [--wait] [--timeout=DURATION]
         [--init_from=JOB|JOB@STEP|WEIGHTS.safetensors] [--model=MODEL.onnx]
                        submit the job spec in FILE (protobuf text format);
                        prints the job id; --init_from starts it from saved
                        weights (fine-tuning; optimizer state starts fresh);
                        --model takes the model and its weights from an ONNX
                        file (FILE then holds the training part only)
  list                  list jobs
  get JOB               show one job
  describe JOB          show one job with its spec, placement, events and
                        progress history
  logs JOB [-f] [--tail=N]
                        the job's log lines from its workers, shards and the
                        coordinator; -f follows them until the job ends
  wait JOB [--timeout=DURATION]
                        follow JOB until it ends (progress on stderr, final
                        line on stdout); exit 0 only if it succeeded
  stop JOB              stop JOB
  delete JOB [--with_checkpoints]
                        remove an ended JOB from the coordinator's store (and
                        its checkpoint files)
  checkpoint JOB [--wait]
                        checkpoint JOB now (at its next step); --wait until
                        the checkpoint is written
  resume JOB [--wait]   continue a FAILED or STOPPED JOB from its newest
                        complete checkpoint
  export JOB --out=FILE [--checkpoint=STEP] [--layout=pytorch|native]
                        write the model of JOB's newest (or STEP's)
                        checkpoint as one safetensors file that PyTorch's
                        load_state_dict takes, and its spec beside it
  export JOB --format=onnx --out=FILE.onnx [--checkpoint=STEP]
                        the same model as an ONNX inference graph (input
                        NCHW for images; outputs logits and probabilities)
  model import MODEL.onnx [--out=SPEC.pbtxt]
                        the ONNX model as a spec's model (printed, or written
                        to SPEC.pbtxt with its weights in SPEC.safetensors)
  dataset import --format=idx --images=PATH --labels=PATH --out_dir=DIR
                 --name=NAME [--shards=N] [--limit=N]
                        convert an IDX image/label pair into record shards
  dataset import [--fashion_mnist=DIR] --out_dir=DIR [--shards=N] [--limit=N]
                        import Fashion-MNIST's train and test sets from DIR
                        (default /usr/share/datasets/fashion-mnist)
  dataset generate --kind=ctr --out_dir=DIR --name=NAME [--examples=N]
                 [--test_examples=M] [--shards=K] [--seed=S] [--zipf=S]
                 [--vocabulary=MIN:MAX|V1,V2,..] [--click_rate=P]
                        write a synthetic click log (Criteo-shaped, known
                        generating model) as NAME-train/NAME-test shards and
                        NAME.json with its Bayes AUC and log loss
  config get-contexts   list the contexts of the config file
  config current-context
  config use-context NAME
  config set-context NAME --coordinator=HOST:PORT [--tls_ca=F --tls_cert=F
                        --tls_key=F --token_file=F]
  config delete-context NAME
  version               downpourctl's version (and the coordinator's address)
  completion bash       a bash completion script: source <(downpourctl completion bash)

the coordinator: --coordinator, else --context's, else $DOWNPOUR_COORDINATOR,
  else the config file's current context, else 127.0.0.1:7070.
security: a coordinator that serves TLS needs --tls_ca; prove who you are with
  --token_file (or $DOWNPOUR_TOKEN) or --tls_cert/--tls_key; each defaults to
  the context's.
flags: -o/--output table|wide|json|yaml, --connect_timeout (default 5s),
       --reconnect_timeout (wait; default 30s); see --help for all.
exit status: 0 ok, 1 failed (job failed or stopped, coordinator error),
             2 usage error or rejected input, 3 wait timed out.)";

constexpr char kCommands[] =
    "nodes submit list get describe logs wait stop delete checkpoint resume export model dataset "
    "config version completion";

// Bash completion: commands, subcommands, flags, and job and node ids asked
// of the coordinator (quietly; nothing when it is unreachable).
constexpr char kBashCompletion[] = R"bash(# bash completion for downpourctl
_downpourctl() {
  local cur prev words cword
  _init_completion 2>/dev/null || {
    cur="${COMP_WORDS[COMP_CWORD]}"; prev="${COMP_WORDS[COMP_CWORD-1]}"
    words=("${COMP_WORDS[@]}"); cword=$COMP_CWORD
  }
  local cmd="" sub="" i
  for ((i = 1; i < cword; i++)); do
    case "${words[i]}" in
      -o) ((i++)) ;;
      -*) ;;
      *) if [[ -z $cmd ]]; then cmd="${words[i]}"; elif [[ -z $sub ]]; then sub="${words[i]}"; fi ;;
    esac
  done
  if [[ $prev == -o || $prev == --output ]]; then
    COMPREPLY=($(compgen -W "table wide json yaml" -- "$cur")); return
  fi
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "--coordinator= --context= --config= --output= --job_id= --wait --timeout= --init_from= --model= --out= --checkpoint= --layout= --format= --follow --tail= --tls_ca= --tls_cert= --tls_key= --token_file= -f -o" -- "$cur"))
    return
  fi
  case "$cmd" in
    "") COMPREPLY=($(compgen -W "%COMMANDS%" -- "$cur")) ;;
    get|describe|logs|wait|stop|delete|checkpoint|resume|export)
      [[ -z $sub ]] && COMPREPLY=($(compgen -W "$(downpourctl list -o json 2>/dev/null | sed -n 's/^  "id": "\(.*\)",$/\1/p')" -- "$cur")) ;;
    nodes)
      if [[ -z $sub ]]; then COMPREPLY=($(compgen -W "drain uncordon" -- "$cur"))
      else COMPREPLY=($(compgen -W "$(downpourctl nodes -o json 2>/dev/null | sed -n 's/^  "id": "\(.*\)",$/\1/p')" -- "$cur")); fi ;;
    config)
      if [[ -z $sub ]]; then COMPREPLY=($(compgen -W "get-contexts current-context use-context set-context delete-context" -- "$cur"))
      else COMPREPLY=($(compgen -W "$(downpourctl config get-contexts -o json 2>/dev/null | sed -n 's/.*"name": "\([^"]*\)".*/\1/p')" -- "$cur")); fi ;;
    dataset) COMPREPLY=($(compgen -W "import generate" -- "$cur")) ;;
    model)
      if [[ -z $sub ]]; then COMPREPLY=($(compgen -W "import" -- "$cur"))
      else COMPREPLY=($(compgen -f -- "$cur")); fi ;;
    completion) COMPREPLY=($(compgen -W "bash" -- "$cur")) ;;
    submit) COMPREPLY=($(compgen -f -- "$cur")) ;;
  esac
}
complete -F _downpourctl downpourctl
)bash";

// absl's own flags, which absl::FindCommandLineFlag may not list.
bool IsAbslBuiltin(absl::string_view name) {
  for (const char* builtin :
       {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch", "version",
        "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}) {
    if (name == builtin) return true;
  }
  return false;
}

// `-o X`, `-o=X` and `-f` are --output's and --follow's short forms,
// rewritten before parsing. Unknown flags and bad values are refused here
// with exit 2 (absl's parser would exit 1). Arguments after `--` are left
// alone.
absl::StatusOr<std::vector<std::string>> ExpandShortFlags(int argc, char** argv) {
  std::vector<std::string> args;
  bool flags = true;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    if (flags && arg == "--") flags = false;
    if (!flags || i == 0 || arg.size() < 2 || arg[0] != '-' || arg == "--") {
      args.push_back(arg);
      continue;
    }
    if (arg == "-o") {
      if (i + 1 == argc) {
        return absl::InvalidArgumentError("-o needs a format: -o table, wide, json or yaml");
      }
      args.push_back(absl::StrCat("--output=", argv[++i]));
      continue;
    }
    if (absl::StartsWith(arg, "-o=")) {
      args.push_back(absl::StrCat("--output=", arg.substr(3)));
      continue;
    }
    if (arg == "-f") {
      args.push_back("--follow");
      continue;
    }
    absl::string_view body = arg;
    if (!absl::ConsumePrefix(&body, "--")) absl::ConsumePrefix(&body, "-");
    const size_t eq = body.find('=');
    const std::string name(body.substr(0, eq));
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() && eq == absl::string_view::npos) {
        args.push_back(arg);
        continue;
      }
    }
    if (flag == nullptr && !IsAbslBuiltin(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag '", arg, "'; see downpourctl --help"));
    }
    if (flag != nullptr && eq != absl::string_view::npos) {
      std::string error;
      if (!flag->ParseFrom(body.substr(eq + 1), &error)) {
        return absl::InvalidArgumentError(absl::StrCat(arg, ": ", error));
      }
    }
    args.push_back(arg);
  }
  return args;
}

// TLS from the resolved files, and the token: --token_file's, else
// $DOWNPOUR_TOKEN, else the context's token_file.
absl::StatusOr<ClientCredentials> CtlCredentials(const CtlContext& security,
                                                 const char* token_env) {
  ClientCredentials credentials;
  SecurityOptions tls;
  tls.tls = TlsFiles{security.tls_cert, security.tls_key, security.tls_ca};
  if (tls.tls.enabled()) {
    ASSIGN_OR_RETURN(credentials.channel, MakeChannelCredentials(tls));
  }
  const std::string token_file = absl::GetFlag(FLAGS_token_file);
  std::string path = !token_file.empty() ? token_file : "";
  if (path.empty() && token_env != nullptr && *token_env != '\0') {
    credentials.bearer_token = std::string(absl::StripAsciiWhitespace(token_env));
    return credentials;
  }
  if (path.empty()) path = security.token_file;
  if (path.empty()) return credentials;
  absl::StatusOr<std::string> token = ReadFileToString(path);
  if (!token.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " cannot be read"));
  }
  credentials.bearer_token = std::string(absl::StripAsciiWhitespace(*token));
  if (credentials.bearer_token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("token file ", path, " is empty"));
  }
  return credentials;
}

std::string ConfigPath() {
  const std::string flag = absl::GetFlag(FLAGS_config);
  if (!flag.empty()) return flag;
  return DefaultConfigPath(std::getenv("XDG_CONFIG_HOME"), std::getenv("HOME"));
}

int RunConfig(const CtlOptions& options, const std::vector<std::string>& args) {
  const std::string path = ConfigPath();
  absl::StatusOr<CtlConfig> config = LoadCtlConfig(path);
  if (!config.ok()) return UsageError(config.status().message());
  const std::string verb = args.empty() ? "" : args[0];
  const auto needs_name = [&](const char* usage) -> int {
    return args.size() == 2 ? kExitOk : UsageError(absl::StrCat("usage: downpourctl ", usage));
  };
  if (verb == "get-contexts" && args.size() == 1) {
    if (PrintsMessages(options.output)) {
      // JSON, which YAML reads too.
      std::cout << "[";
      for (size_t i = 0; i < config->contexts.size(); ++i) {
        const CtlContext& c = config->contexts[i];
        std::cout << (i ? ",\n " : "\n ") << "{\"name\": \"" << absl::CEscape(c.name)
                  << "\", \"coordinator\": \"" << absl::CEscape(c.coordinator)
                  << "\", \"current\": " << (c.name == config->current_context ? "true" : "false")
                  << "}";
      }
      std::cout << (config->contexts.empty() ? "]" : "\n]") << std::endl;
      return kExitOk;
    }
    std::vector<std::vector<std::string>> table;
    for (const CtlContext& c : config->contexts) {
      table.push_back({c.name == config->current_context ? "*" : "", c.name, c.coordinator});
    }
    PrintTable({"CURRENT", "NAME", "COORDINATOR"}, table);
    return kExitOk;
  }
  if (verb == "current-context" && args.size() == 1) {
    if (config->current_context.empty()) return Fail(kExitFailed, "no current context is set");
    std::cout << config->current_context << std::endl;
    return kExitOk;
  }
  if (verb == "use-context") {
    if (int code = needs_name("config use-context NAME"); code != kExitOk) return code;
    if (config->Find(args[1]) == nullptr) {
      return UsageError(
          absl::StrCat("no context '", args[1], "' in ", path, "; add it with config set-context"));
    }
    config->current_context = args[1];
  } else if (verb == "set-context") {
    if (int code = needs_name("config set-context NAME --coordinator=HOST:PORT"); code != kExitOk) {
      return code;
    }
    const std::string address = absl::GetFlag(FLAGS_coordinator);
    absl::StatusOr<HostPort> parsed = ParseHostPort(address);
    if (!parsed.ok()) {
      return UsageError(absl::StrCat("config set-context needs --coordinator=HOST:PORT",
                                     address.empty() ? "" : absl::StrCat(", not '", address, "'")));
    }
    CtlContext* existing = nullptr;
    for (CtlContext& c : config->contexts) {
      if (c.name == args[1]) existing = &c;
    }
    if (existing == nullptr) existing = &config->contexts.emplace_back(CtlContext{args[1], ""});
    existing->coordinator = address;
    existing->tls_ca = absl::GetFlag(FLAGS_tls_ca);
    existing->tls_cert = absl::GetFlag(FLAGS_tls_cert);
    existing->tls_key = absl::GetFlag(FLAGS_tls_key);
    existing->token_file = absl::GetFlag(FLAGS_token_file);
    if (config->current_context.empty()) config->current_context = args[1];
  } else if (verb == "delete-context") {
    if (int code = needs_name("config delete-context NAME"); code != kExitOk) return code;
    if (config->Find(args[1]) == nullptr) {
      return UsageError(absl::StrCat("no context '", args[1], "' in ", path));
    }
    config->contexts.erase(std::remove_if(config->contexts.begin(), config->contexts.end(),
                                          [&](const CtlContext& c) { return c.name == args[1]; }),
                           config->contexts.end());
    if (config->current_context == args[1]) config->current_context.clear();
  } else {
    return UsageError(
        "config takes get-contexts, current-context, use-context NAME, set-context NAME "
        "--coordinator=HOST:PORT or delete-context NAME");
  }
  absl::Status saved = SaveCtlConfig(path, *config);
  if (!saved.ok()) return FailStatus(saved);
  std::cout << "config " << verb << " " << args[1] << ": written to " << path << std::endl;
  return kExitOk;
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(kUsage);
  absl::StatusOr<std::vector<std::string>> expanded = ExpandShortFlags(argc, argv);
  if (!expanded.ok()) return UsageError(expanded.status().message());
  std::vector<char*> expanded_argv;
  for (std::string& arg : *expanded) expanded_argv.push_back(arg.data());
  std::vector<char*> positional =
      absl::ParseCommandLine(static_cast<int>(expanded_argv.size()), expanded_argv.data());
  if (positional.size() < 2) {
    std::cerr << kUsage << std::endl;
    return kExitUsage;
  }
  const std::string command = positional[1];
  const std::vector<std::string> args(positional.begin() + 2, positional.end());

  CtlOptions options;
  absl::StatusOr<OutputFormat> output = ParseOutputFormat(absl::GetFlag(FLAGS_output));
  if (!output.ok()) return UsageError(output.status().message());
  options.output = *output;
  absl::StatusOr<absl::Duration> timeout =
      ParseDurationFlag("timeout", absl::GetFlag(FLAGS_timeout));
  if (!timeout.ok()) return UsageError(timeout.status().message());
  options.wait_timeout = *timeout;
  absl::StatusOr<absl::Duration> connect_timeout =
      ParseDurationFlag("connect_timeout", absl::GetFlag(FLAGS_connect_timeout));
  if (!connect_timeout.ok()) return UsageError(connect_timeout.status().message());
  options.connect_timeout = *connect_timeout;
  absl::StatusOr<absl::Duration> reconnect_timeout =
      ParseDurationFlag("reconnect_timeout", absl::GetFlag(FLAGS_reconnect_timeout));
  if (!reconnect_timeout.ok()) return UsageError(reconnect_timeout.status().message());
  options.reconnect_timeout = *reconnect_timeout;
  options.job_id = absl::GetFlag(FLAGS_job_id);
  options.wait = absl::GetFlag(FLAGS_wait);
  options.init_from = absl::GetFlag(FLAGS_init_from);
  options.model = absl::GetFlag(FLAGS_model);
  options.out = absl::GetFlag(FLAGS_out);
  options.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  options.layout = absl::GetFlag(FLAGS_layout);
  options.follow = absl::GetFlag(FLAGS_follow);
  options.with_checkpoints = absl::GetFlag(FLAGS_with_checkpoints);
  options.tail = absl::GetFlag(FLAGS_tail);
  const std::string format = absl::GetFlag(FLAGS_format);
  options.format = format.empty() ? "idx" : format;
  options.export_format = format.empty() ? "safetensors" : format;
  options.images = absl::GetFlag(FLAGS_images);
  options.labels = absl::GetFlag(FLAGS_labels);
  options.out_dir = absl::GetFlag(FLAGS_out_dir);
  options.name = absl::GetFlag(FLAGS_name);
  options.fashion_mnist = absl::GetFlag(FLAGS_fashion_mnist);
  options.shards = absl::GetFlag(FLAGS_shards);
  options.limit = absl::GetFlag(FLAGS_limit);
  options.kind = absl::GetFlag(FLAGS_kind);
  options.examples = absl::GetFlag(FLAGS_examples);
  options.test_examples = absl::GetFlag(FLAGS_test_examples);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.zipf = absl::GetFlag(FLAGS_zipf);
  options.vocabulary = absl::GetFlag(FLAGS_vocabulary);
  options.sparse_features = absl::GetFlag(FLAGS_sparse_features);
  options.dense_features = absl::GetFlag(FLAGS_dense_features);
  options.max_ids = absl::GetFlag(FLAGS_max_ids);
  options.click_rate = absl::GetFlag(FLAGS_click_rate);

  if (command == "dataset") return RunDataset(options, args);
  if (command == "model") return RunModel(options, args);
  if (command == "config") return RunConfig(options, args);
  if (command == "completion") {
    if (args.size() != 1 || args[0] != "bash") {
      return UsageError("completion takes one shell, bash: downpourctl completion bash");
    }
    std::string script = kBashCompletion;
    script.replace(script.find("%COMMANDS%"), 10, kCommands);
    std::cout << script;
    return kExitOk;
  }

  absl::StatusOr<CtlConfig> config = LoadCtlConfig(ConfigPath());
  if (!config.ok()) return UsageError(config.status().message());
  std::string source;
  absl::StatusOr<std::string> coordinator =
      ResolveCoordinator(absl::GetFlag(FLAGS_coordinator), std::getenv("DOWNPOUR_COORDINATOR"),
                         absl::GetFlag(FLAGS_context), *config, &source);
  if (!coordinator.ok()) return UsageError(coordinator.status().message());
  options.coordinator = *coordinator;
  absl::StatusOr<HostPort> address = ParseHostPort(options.coordinator);
  if (!address.ok()) {
    return UsageError(absl::StrCat(
        source == "--coordinator" ? "--coordinator=" : "coordinator ", options.coordinator,
        source == "--coordinator" ? "" : absl::StrCat(" (from ", source, ")"),
        " is not HOST:PORT: ", address.status().message()));
  }

  absl::StatusOr<ClientCredentials> credentials = CtlCredentials(
      ResolveSecurity(CtlContext{"", "", absl::GetFlag(FLAGS_tls_ca), absl::GetFlag(FLAGS_tls_cert),
                                 absl::GetFlag(FLAGS_tls_key), absl::GetFlag(FLAGS_token_file)},
                      source, *config),
      std::getenv("DOWNPOUR_TOKEN"));
  if (!credentials.ok()) return UsageError(credentials.status().message());
  options.credentials = *std::move(credentials);

  if (command == "version") {
    if (!args.empty()) return UsageError("version takes no arguments");
    std::cout << "downpourctl " << BuildVersion() << " (commit " << BuildCommit()
              << "), coordinator " << options.coordinator << " (from " << source << ")"
              << std::endl;
    return kExitOk;
  }
  if (command == "nodes") return RunNodes(options, args);
  if (command == "list") return RunList(options, args);
  if (command == "submit") return RunSubmit(options, args);
  if (command == "get") return RunGet(options, args);
  if (command == "describe") return RunDescribe(options, args);
  if (command == "logs") return RunLogs(options, args);
  if (command == "wait") return RunWait(options, args);
  if (command == "stop") return RunStop(options, args);
  if (command == "delete") return RunDelete(options, args);
  if (command == "checkpoint") return RunCheckpoint(options, args);
  if (command == "resume") return RunResume(options, args);
  if (command == "export") return RunExport(options, args);
  return UsageError(absl::StrCat("unknown command '", command, "'; commands are ", kCommands));
}

}  // namespace
}  // namespace downpour

int main(int argc, char** argv) { return downpour::Main(argc, argv); }
