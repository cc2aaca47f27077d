#include "app/argv_check.h"

#include <string_view>

#include <fmt/format.h>

namespace shoal::app {

namespace {

struct ForeignFlag {
  std::string_view names;  // llama.cpp's spellings, ' '-separated
  std::string_view what;   // its meaning there
  std::string_view here;   // what Shoal does instead
};

constexpr std::string_view kNoDownload =
    "models are not downloaded: give a local .gguf file or checkpoint folder with -m";
constexpr std::string_view kDevices =
    "choose devices with --device (cuda:0, or a list cuda:0,cuda:1 on run / check: one process per device, the "
    "layers split between them)";
constexpr std::string_view kOnePrompt =
    "`run` answers one prompt (-p or -f); `shoal host` reads one prompt a line from stdin";

// llama.cpp flags a llama.cpp user types that CLI11 would misread (multi-letter, one dash), or
// that Shoal spells differently.
constexpr ForeignFlag kFlags[] = {
    {"-ngl --n-gpu-layers --gpu-layers", "layers to offload to the GPU",
     "a process runs all of its layers on its --device (e.g. --device cuda:0); a model larger than one device "
     "runs over a pool"},
    {"-fa --flash-attn", "flash attention",
     "attention on cuda:N is always fused (flash-decoding); there is nothing to turn on"},
    {"-hf -hfr --hf-repo -hff --hf-file -hft --hf-token -hfv -hffv -mu --model-url -dr --docker-repo",
     "a model to download", kNoDownload},
    {"-mg --main-gpu", "the main GPU", kDevices},
    {"-sm --split-mode", "how to split the model over GPUs", kDevices},
    {"-ts --tensor-split", "the share of each GPU", kDevices},
    {"-dev", "the devices to use", kDevices},
    {"-ctk --cache-type-k -ctv --cache-type-v", "the KV cache type",
     "the KV cache type is --kv f16, q8_0 or f32 (keys and values alike)"},
    {"-nkvo --no-kv-offload", "the KV cache on the host", "a layer's KV cache stays on its layer's device"},
    {"-ub --ubatch-size", "the physical batch", "the prompt step is -b / --batch-size"},
    {"-tb --threads-batch", "threads for the prompt",
     "one thread count, -t / --threads, serves the prompt and the generation"},
    {"-cnv --conversation -no-cnv --no-conversation -sys --system-prompt -st --single-turn", "chat mode", kOnePrompt},
    {"-np --parallel -cb --cont-batching -nocb --no-cont-batching", "parallel requests",
     "requests are answered one at a time"},
    {"-co --color", "coloured output", "the output is plain text"},
    {"-ot --override-tensor -cmoe --cpu-moe -ncmoe --n-cpu-moe", "where given tensors are placed",
     "a process holds whole layers on its --device; a pool splits by layers"},
    {"-md --model-draft -ngld -devd -td -cd", "a draft model", "there is no draft model option"},
    {"-lv --verbosity --log-verbosity", "the log verbosity",
     "the log level is --log-level trace|debug|info|warn|error|off, an option of every command (shoal --help)"},
    {"--log-disable", "turning the log off", "--log-level off (an option of every command: shoal --help)"},
    {"--no-mmap --mlock", "how the weights are held in memory",
     "a slice reads its layers' tensors from the file one at a time (mapped on the CPU, copied to a GPU); there is "
     "nothing to choose"},
    {"-r --reverse-prompt", "a stop text", "generation stops at the model's end-of-generation tokens, -n or a full context"},
    {"--grammar --grammar-file -j --json-schema --json-schema-file", "constrained sampling",
     "sampling is not constrained; the samplers are --top-k, --top-p, --min-p, --temp and the penalties"},
    {"--mirostat --mirostat-lr --mirostat-ent --typical --top-nsigma --xtc-probability --xtc-threshold "
     "--dry-multiplier --dry-base --dry-allowed-length --dry-penalty-last-n --dynatemp-range --dynatemp-exp",
     "a sampler", "the samplers are --top-k, --top-p, --min-p, --temp and the penalties (--repeat-penalty, "
     "--frequency-penalty, --presence-penalty)"},
};

// llama.cpp's short spellings of options Shoal spells only in full (CLI11 takes one letter after
// one dash).
struct Renamed {
  std::string_view name;
  std::string_view here;
};
constexpr Renamed kRenamed[] = {{"-sp", "--special"}};

// The flag of kFlags that `a` names (the part before a '='), or nullptr.
const ForeignFlag* llama_cpp_flag(std::string_view a) {
  a = a.substr(0, a.find('='));
  for (const ForeignFlag& f : kFlags) {
    for (size_t at = 0; at < f.names.size();) {
      size_t end = f.names.find(' ', at);
      if (end == std::string_view::npos) end = f.names.size();
      if (f.names.substr(at, end - at) == a) return &f;
      at = end + 1;
    }
  }
  return nullptr;
}

// "-xy...": one dash, then two ASCII letters (CLI11 would read -x with the value "y...", as -ngl99
// for -n "gl99"; a number given with its letter, -n5, stays valid).
bool word_after_one_dash(std::string_view a) {
  auto letter = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  return a.size() >= 3 && a[0] == '-' && letter(a[1]) && letter(a[2]);
}

}  // namespace

std::optional<std::string> command_line_error(const CLI::App& app, int argc, const char* const* argv) {
  std::string names;  // the commands, for the messages
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  std::optional<std::string> misplaced;  // the first word before or instead of the command
  bool word_seen = false;                // a word that is no option's value, at the top level
  const CLI::App* cmd = &app;            // the command whose options follow
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (!a.starts_with("-")) {
      if (cmd == &app) {
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
          if (sub->get_name() == a) cmd = sub;
        }
        if (cmd == &app && !word_seen && !misplaced) {
          misplaced = fmt::format("'{}' is not a command (commands: {}; see shoal --help)", a, names);
        }
        word_seen = true;
      }
      continue;
    }
    const std::string name = a.substr(0, a.find('='));
    const CLI::Option* opt = a == "--" ? nullptr : cmd->get_option_no_throw(name);
    if (!opt && cmd != &app) opt = app.get_option_no_throw(name);  // a global option after the command
    if (opt) {
      if (opt->get_items_expected_min() > 0 && name.size() == a.size()) ++i;  // its value, whatever it reads
      continue;
    }
    if (cmd == &app && !word_seen && !misplaced && a != "-h" && a != "--help") {
      misplaced = fmt::format("{} before a command: a command's options follow its name, shoal COMMAND {} ... "
                              "(commands: {}; see shoal --help)", a, a, names);
    }
    if (a == "--") break;  // the rest is positional
    if (const ForeignFlag* f = llama_cpp_flag(a)) {
      return fmt::format("{} is llama.cpp's flag for {}; Shoal has no such option: {} (see shoal {}--help)", name,
                         f->what, f->here, cmd == &app ? "" : cmd->get_name() + " ");
    }
    for (const Renamed& r : kRenamed) {
      if (name == r.name && cmd->get_option_no_throw(std::string(r.here))) {
        return fmt::format("{} is llama.cpp's short form of {}: spell it out (see shoal {} --help)", name, r.here,
                           cmd->get_name());
      }
    }
    if (word_after_one_dash(name)) {
      return fmt::format("{} is not an option (one dash goes with one letter, as in -m MODEL, the value after a space; "
                         "long options take two, as in --model; see shoal {}--help)", a,
                         cmd == &app ? "" : cmd->get_name() + " ");
    }
  }
  return misplaced;
}

}  // namespace shoal::app
