// YAML <-> Config. The key table (`describe`) is the one place that names each
// key and its constraint: loading, overrides, writing, validation and key
// suggestions all walk the same table, bound to the Config at hand.
#include "cqk/config_loader.h"
#include "export/model_config_json.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <utility>
#include <variant>

#include <sys/stat.h>

namespace cqk {
namespace embedded {
extern const char kDefaultConfigYaml[];  // generated from configs/default.yaml (src/CMakeLists.txt)
}

namespace {

namespace fs = std::filesystem;

constexpr double kInf = std::numeric_limits<double>::infinity();

// --- the key table ------------------------------------------------------------

// A number's allowed range (ends closed unless marked open). The default
// allows everything (doubles must be finite). An enum's names are its rule.
struct Rule {
  double lo = -kInf;
  double hi = kInf;
  bool hi_open = false;
  bool lo_open = false;
};

Rule at_least(double lo) { return Rule{lo, kInf, false, false}; }
Rule above(double lo) { return Rule{lo, kInf, false, true}; }
Rule within(double lo, double hi, bool hi_open = false) { return Rule{lo, hi, hi_open, false}; }

// An enum's value by its config name; the names are in enum order (kind_table.h).
struct Choice {
  std::function<std::string()> get;
  std::function<bool(const std::string&)> set;  // false: not one of the names
  const std::vector<std::string>* names;
};

using Leaf = std::variant<std::monostate, int64_t*, double*, bool*, std::string*, Choice>;

// A key: a value bound to a member of one Config, or a section of keys.
struct Field {
  std::string name;
  Leaf leaf;                    // monostate for a section
  Rule rule;
  std::vector<Field> children;  // a section's keys, in file order
  bool is_section() const { return std::holds_alternative<std::monostate>(leaf); }
};

template <class T>
Field key(const char* name, T& member, Rule rule = {}) {
  return Field{name, &member, std::move(rule), {}};
}
template <class Kind>
Field key(const char* name, Kind& member, const std::vector<std::string>& names) {
  static_assert(std::is_enum_v<Kind>);
  Choice choice{[&member, &names] { return names.at(static_cast<size_t>(member)); },
                [&member, &names](const std::string& text) {
                  const auto at = std::find(names.begin(), names.end(), text);
                  if (at == names.end()) return false;
                  return member = static_cast<Kind>(at - names.begin()), true;
                },
                &names};
  return Field{name, std::move(choice), {}, {}};
}
Field section(const char* name, std::vector<Field> children) {
  return Field{name, std::monostate{}, {}, std::move(children)};
}

std::vector<Field> describe(CouplingOptions& c) {
  return {key("kind", c.kind(), coupling_kind_names()),
          key("hidden", c.hidden(), at_least(1)),
          key("steps", c.steps(), within(1, 8)),
          key("clamp", c.clamp(), above(0)),
          key("shared_across_heads", c.shared_across_heads()),
          key("separate_pairs", c.separate_pairs()),
          key("integrator", c.integrator(), integrator_names()),
          key("dt_init", c.dt_init()),
          key("recompute_from_inverse", c.recompute_from_inverse())};
}

std::vector<Field> describe(MultiTokenOptions& c) {
  return {key("every", c.every(), at_least(1)), key("query_kernel", c.query_kernel(), at_least(1)),
          key("key_kernel", c.key_kernel(), at_least(1)), key("head_group", c.head_group(), at_least(1))};
}

// model.attention: the keys of AttentionOptions; its shape comes from model.* per layer.
std::vector<Field> describe(AttentionOptions& c) {
  return {key("kind", c.kind(), attention_kind_names()), key("head_norm_init", c.head_norm_init(), at_least(0)),
          section("coupling", describe(c.coupling())), section("mta", describe(c.mta()))};
}

std::vector<Field> describe(ModelConfig& c) {
  return {key("vocab_size", c.vocab_size, at_least(0)),
          key("width", c.width, at_least(1)),
          key("layers", c.layers, at_least(1)),
          key("heads", c.heads, at_least(1)),
          key("kv_heads", c.kv_heads, at_least(0)),
          key("mlp", c.mlp, kind_names<kMlpKindNames>()),
          key("mlp_hidden", c.mlp_hidden, at_least(0)),
          key("rope_base", c.rope_base, above(0)),
          key("init_std", c.init_std, above(0)),
          key("norm_eps", c.norm_eps, above(0)),
          section("attention", describe(c.attention))};
}

std::vector<Field> describe(RecallConfig& c) {
  return {key("vocab_size", c.vocab_size, at_least(4)), key("pairs", c.pairs, at_least(1)),
          key("power_law", c.power_law, at_least(0)), key("train_examples", c.train_examples, at_least(1)),
          key("eval_examples", c.eval_examples, at_least(1))};
}

std::vector<Field> describe(DataConfig& c) {
  return {key("kind", c.kind, kind_names<kDataKindNames>()),
          key("dir", c.dir),
          key("seq_len", c.seq_len, at_least(2)),
          key("batch_size", c.batch_size, at_least(1)),
          key("eval_stride", c.eval_stride, at_least(0)),
          key("prefetch", c.prefetch, at_least(0)),
          section("recall", describe(c.recall))};
}

std::vector<Field> describe(TrainConfig& c) {
  return {key("steps", c.steps, at_least(1)),
          key("lr", c.lr, above(0)),
          key("min_lr_ratio", c.min_lr_ratio, within(0, 1)),
          key("warmup_steps", c.warmup_steps, at_least(0)),
          key("schedule", c.schedule, kind_names<kLrScheduleNames>()),
          key("decay_fraction", c.decay_fraction, within(0, 1)),
          key("weight_decay", c.weight_decay, at_least(0)),
          key("beta1", c.beta1, within(0, 1, /*hi_open=*/true)),
          key("beta2", c.beta2, within(0, 1, /*hi_open=*/true)),
          key("eps", c.eps, above(0)),
          key("grad_clip", c.grad_clip, at_least(0)),
          key("grad_accum", c.grad_accum, at_least(1)),
          key("decay_norms_and_biases", c.decay_norms_and_biases),
          key("decay_embeddings", c.decay_embeddings),
          key("coupling_lr_scale", c.coupling_lr_scale, above(0)),
          key("decay_coupling", c.decay_coupling),
          key("eval_every", c.eval_every, at_least(1)),
          key("eval_batches", c.eval_batches, at_least(0)),
          key("log_every", c.log_every, at_least(1)),
          key("checkpoint_every", c.checkpoint_every, at_least(1)),
          key("keep_checkpoints", c.keep_checkpoints, at_least(1)),
          key("device", c.device, kind_names<kDeviceChoiceNames>()),
          key("dtype", c.dtype, kind_names<kPrecisionNames>()),
          key("sdpa_backend", c.sdpa_backend, sdpa_backend_names()),
          key("threads", c.threads, at_least(0))};
}

std::vector<Field> describe(LogConfig& c) { return {key("tensorboard", c.tensorboard)}; }

std::vector<Field> describe(RunConfig& c) {
  return {key("name", c.name), key("dir", c.dir), key("seed", c.seed, at_least(0))};
}

Field describe(Config& c) {
  return section("", {section("run", describe(c.run)), section("model", describe(c.model)),
                      section("data", describe(c.data)), section("train", describe(c.train)),
                      section("log", describe(c.log))});
}

const Field* child(const Field& section, const std::string& name) {
  for (const Field& f : section.children)
    if (f.name == name) return &f;
  return nullptr;
}

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

// Calls fn(field, key path) for every key below `f`, sections before their keys.
void walk(const Field& f, const std::string& path, const std::function<void(const Field&, const std::string&)>& fn) {
  for (const Field& c : f.children) {
    fn(c, join(path, c.name));
    walk(c, join(path, c.name), fn);
  }
}

// --- messages -------------------------------------------------------------------

ConfigError config_error(std::string message) {
  std::replace(message.begin(), message.end(), '\n', ' ');
  std::replace(message.begin(), message.end(), '\r', ' ');
  return ConfigError(message);
}

// A value as shown in a message: one longer than 60 bytes keeps its start and
// its end (where a typo is as likely), cut between UTF-8 characters.
std::string quote(const std::string& text) {
  constexpr size_t kMax = 60, kKeep = kMax / 2;
  if (text.size() <= kMax) return "'" + text + "'";
  const auto continuation = [&](size_t i) { return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80; };
  size_t head = kKeep, tail = text.size() - kKeep;
  while (head > 0 && continuation(head)) --head;
  while (tail < text.size() && continuation(tail)) ++tail;
  return "'" + text.substr(0, head) + "..." + text.substr(tail) + "'";
}

std::string join_names(const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& name : names) list += (list.empty() ? "" : "|") + name;
  return list;
}

// A file name as shown in a message: whole, however deep the folder, since
// a shortened one may no longer say which file.
std::string quote_path(const std::string& path) { return "'" + path + "'"; }

std::string describe_node(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Null: return "nothing";
    case YAML::NodeType::Scalar: return (node.Tag() == "!" ? "the quoted string " : "") + quote(node.Scalar());
    case YAML::NodeType::Sequence: return "a list";
    case YAML::NodeType::Map: return "a map";
    default: return "an undefined value";
  }
}

// Where a value came from: errors name it, and the line when it is a file.
struct Origin {
  std::string source;
  bool with_lines = false;

  [[noreturn]] void fail(const std::string& path, const std::string& what,
                         const YAML::Node* at = nullptr) const {
    std::string message = source + ": " + (path.empty() ? "" : path + ": ") + what;
    if (with_lines && at != nullptr && at->Mark().line >= 0)
      message += " (line " + std::to_string(at->Mark().line + 1) + ")";
    throw config_error(message);
  }
};

// Edit distance with adjacent transpositions (optimal string alignment).
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

// "unknown key, did you mean 'lr'?": a key of that name in another section,
// else the closest key of this section, else the list of this section's keys.
std::string unknown_key(const Field& root, const Field& section, const std::string& name, bool top) {
  std::vector<std::string> names;
  for (const Field& f : section.children) names.push_back(f.name);
  if (top) names.push_back("inherit");

  std::string elsewhere;
  walk(root, "", [&](const Field& f, const std::string& path) {
    if (f.name == name && elsewhere.empty()) elsewhere = path;
  });
  if (!elsewhere.empty()) return "unknown key, did you mean '" + elsewhere + "'?";

  const size_t limit = std::clamp<size_t>(name.size() / 3, 1, 3);
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& candidate : names) {
    const bool prefix = name.size() >= 3 && (candidate.rfind(name, 0) == 0 || name.rfind(candidate, 0) == 0);
    const size_t distance = prefix ? 1 : edit_distance(name, candidate);
    if (distance < best_distance) best = candidate, best_distance = distance;
  }
  if (!best.empty()) return "unknown key, did you mean '" + best + "'?";

  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
  return "unknown key (valid keys: " + list + ")";
}

// --- scalars --------------------------------------------------------------------

// Shortest text that reads back to the same double, always with a '.' in the
// mantissa so that YAML 1.1 readers (PyYAML) also see a float.
std::string format_double(double v) {
  if (std::isnan(v)) return ".nan";
  if (std::isinf(v)) return v > 0 ? ".inf" : "-.inf";
  char buffer[64];
  const auto end = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::general).ptr;
  std::string text(buffer, end);
  const size_t exponent = std::min(text.find('e'), text.size());
  if (text.substr(0, exponent).find('.') == std::string::npos) text.insert(exponent, ".0");
  return text;
}

std::string scalar_text(const Leaf& leaf) {
  if (auto* p = std::get_if<int64_t*>(&leaf)) return std::to_string(**p);
  if (auto* p = std::get_if<double*>(&leaf)) return format_double(**p);
  if (auto* p = std::get_if<bool*>(&leaf)) return **p ? "true" : "false";
  if (auto* p = std::get_if<std::string*>(&leaf)) return **p;
  if (auto* p = std::get_if<Choice>(&leaf)) return p->get();
  return {};
}

bool parse_scalar(const std::string& text, double& out) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == ".inf" || lower == "+.inf") return out = kInf, true;
  if (lower == "-.inf") return out = -kInf, true;
  if (lower == ".nan") return out = std::numeric_limits<double>::quiet_NaN(), true;
  const char* begin = text.data() + (text.rfind('+', 0) == 0 ? 1 : 0);
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, out);
  return ec == std::errc() && ptr == end && begin != end;
}

// Decimal integers; a float literal with an integral value (1e6, 2.0) is accepted too.
bool parse_scalar(const std::string& text, int64_t& out) {
  const char* begin = text.data() + (text.rfind('+', 0) == 0 ? 1 : 0);
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(begin, end, out);
  if (ec == std::errc() && ptr == end && begin != end) return true;
  double value = 0;
  if (!parse_scalar(text, value) || !std::isfinite(value) || value != std::trunc(value) ||
      std::abs(value) >= 9.2e18)
    return false;
  return out = static_cast<int64_t>(value), true;
}

bool parse_scalar(const std::string& text, bool& out) {
  static const std::set<std::string> yes{"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON"};
  static const std::set<std::string> no{"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF"};
  if (yes.count(text) != 0) return out = true, true;
  if (no.count(text) != 0) return out = false, true;
  return false;
}

bool parse_scalar(const std::string& text, std::string& out) { return out = text, true; }

const char* expected(const Leaf& leaf) {
  static const char* const names[] = {"a section", "an integer", "a number", "true or false", "a string", "a string"};
  return names[leaf.index()];
}

// Sets a leaf from a node; returns what is wrong, or "" when it worked.
std::string assign(const Leaf& leaf, const YAML::Node& node) {
  if (const auto* choice = std::get_if<Choice>(&leaf)) {
    if (!node.IsNull() && !node.IsScalar()) return std::string("expected a string, got ") + describe_node(node);
    const std::string text = node.IsNull() ? "" : node.Scalar();
    return choice->set(text) ? "" : "expected one of " + join_names(*choice->names) + ", got " + quote(text);
  }
  const bool is_string = std::holds_alternative<std::string*>(leaf);
  if (is_string && node.IsNull()) return *std::get<std::string*>(leaf) = "", "";
  // A quoted scalar is a string in YAML: not a number or a bool.
  const bool plain = node.IsScalar() && (is_string || node.Tag() != "!");
  const bool ok = plain && std::visit(
                               [&](auto member) {
                                 if constexpr (std::is_same_v<decltype(member), std::monostate> ||
                                               std::is_same_v<decltype(member), Choice>)
                                   return false;
                                 else return parse_scalar(node.Scalar(), *member);
                               },
                               leaf);
  return ok ? "" : std::string("expected ") + expected(leaf) + ", got " + describe_node(node);
}

std::string range_text(const Rule& r) {
  const auto num = [](double v) {
    std::string s = format_double(v);
    return s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0 ? s.substr(0, s.size() - 2) : s;
  };
  if (r.hi == kInf) return std::string(r.lo_open ? "> " : ">= ") + num(r.lo);
  return std::string(r.lo_open ? "in (" : "in [") + num(r.lo) + ", " + num(r.hi) + (r.hi_open ? ")" : "]");
}

// What is wrong with a leaf's current value under its rule, or "".
std::string violation(const Field& f) {
  const Rule& r = f.rule;
  double v = 0;
  if (auto* p = std::get_if<int64_t*>(&f.leaf)) v = static_cast<double>(**p);
  else if (auto* q = std::get_if<double*>(&f.leaf)) v = **q;
  else return {};
  if (!std::isfinite(v)) return "must be finite, got " + scalar_text(f.leaf);
  const bool ok = (r.lo_open ? v > r.lo : v >= r.lo) && (r.hi_open ? v < r.hi : v <= r.hi);
  return ok ? "" : "must be " + range_text(r) + ", got " + scalar_text(f.leaf);
}

// --- applying YAML --------------------------------------------------------------

void apply(const Field& root, const Field& field, const YAML::Node& node, const std::string& path,
           const Origin& origin);

void apply_section(const Field& root, const Field& section, const YAML::Node& node, const std::string& path,
                   const Origin& origin) {
  if (node.IsNull()) return;
  if (!node.IsMap()) origin.fail(path, "expected a map of keys, got " + describe_node(node), &node);
  const bool top = &section == &root;
  std::set<std::string> seen;
  for (const auto& entry : node) {
    const YAML::Node& k = entry.first;
    if (!k.IsScalar()) origin.fail(path, "expected a key name, got " + describe_node(k), &k);
    const std::string& name = k.Scalar();
    const std::string key_path = join(path, name);
    if (!seen.insert(name).second) origin.fail(key_path, "duplicate key", &k);
    if (top && name == "inherit") continue;  // handled by load_text
    const Field* f = child(section, name);
    if (f == nullptr) origin.fail(key_path, unknown_key(root, section, name, top), &k);
    apply(root, *f, entry.second, key_path, origin);
  }
}

void apply(const Field& root, const Field& field, const YAML::Node& node, const std::string& path,
           const Origin& origin) {
  if (field.is_section()) return apply_section(root, field, node, path, origin);
  std::string problem = assign(field.leaf, node);
  if (problem.empty()) problem = violation(field);
  if (!problem.empty()) origin.fail(path, problem, &node);
}

YAML::Node parse_yaml(const std::string& text, const std::string& source) {
  // yaml-cpp stops reading at a NUL byte: a binary file (a checkpoint, model.pt)
  // starting with one would load as an empty config, i.e. all defaults.
  if (const size_t nul = text.find('\0'); nul != std::string::npos)
    throw config_error(source + ": not a YAML text file (NUL byte at offset " + std::to_string(nul) + ")");
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    const std::string where = e.mark.line >= 0
        ? ":" + std::to_string(e.mark.line + 1) + ":" + std::to_string(e.mark.column + 1) : "";
    throw config_error(source + where + ": invalid YAML: " + e.msg);
  }
}

// POSIX calls, not std::filesystem's operations on the disk: libtorch.so exports
// its own copies of those, built against a newer libstdc++, and some of them
// crash in a process that links it (see tests/token_loader_test.cpp).
std::string canonical_path(const std::string& path) {
  char* resolved = ::realpath(path.c_str(), nullptr);
  if (resolved == nullptr) return fs::path(path).lexically_normal().string();
  std::string result(resolved);
  std::free(resolved);
  return result;
}

bool read_text(const std::string& path, std::string& text, std::string& why) {
  struct stat info {};
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) return why = "is a directory", false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return why = std::strerror(errno), false;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return why = "read failed", false;
  return text = buffer.str(), true;
}

// The files being loaded, outermost first: (canonical path, name as shown).
using Chain = std::vector<std::pair<std::string, std::string>>;

void load_text(Config& config, const std::string& text, const std::string& source, const fs::path& dir,
               Chain& chain);

void load_file(Config& config, const std::string& path, Chain& chain, const Origin* parent,
               const YAML::Node* parent_node) {
  const std::string canonical = canonical_path(path);
  for (size_t i = 0; i < chain.size(); ++i) {
    if (chain[i].first != canonical) continue;
    std::string cycle;
    for (size_t j = i; j < chain.size(); ++j) cycle += chain[j].second + " -> ";
    parent->fail("inherit", "inheritance cycle: " + cycle + path, parent_node);
  }
  std::string text, why;
  if (!read_text(path, text, why)) {
    if (parent != nullptr) parent->fail("inherit", "cannot read " + quote_path(path) + ": " + why, parent_node);
    throw config_error(path + ": cannot read config file: " + why);
  }
  chain.emplace_back(canonical, path);
  load_text(config, text, path, fs::path(path).parent_path(), chain);
  chain.pop_back();
}

void load_text(Config& config, const std::string& text, const std::string& source, const fs::path& dir,
               Chain& chain) {
  const YAML::Node doc = parse_yaml(text, source);
  const Origin origin{source, true};
  if (doc.IsMap()) {
    if (const YAML::Node base = doc["inherit"]) {
      if (!base.IsScalar() || base.Scalar().empty())
        origin.fail("inherit", "expected a file name, got " + describe_node(base), &base);
      fs::path base_path(base.Scalar());
      if (base_path.is_relative()) base_path = dir / base_path;
      load_file(config, base_path.lexically_normal().string(), chain, &origin, &base);
    }
  }
  const Field root = describe(config);
  apply_section(root, root, doc, "", origin);
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t");
  const size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

void check_relations(const Config& c, const Origin& origin) {
  const auto require = [&](bool ok, const char* path, const std::string& what) {
    if (!ok) origin.fail(path, what);
  };
  const auto n = [](int64_t v) { return std::to_string(v); };
  const ModelConfig& m = c.model;
  if (const auto problem = model_shape_problem(m)) origin.fail(problem->key, problem->what);

  const DataConfig& d = c.data;
  require(d.kind != DataKind::Tokens || !d.dir.empty(), "data.dir", "required when data.kind is tokens");
  require(d.eval_stride <= d.seq_len, "data.eval_stride",
          "must be at most data.seq_len (" + n(d.seq_len) + "), got " + n(d.eval_stride));
  if (d.kind == DataKind::Recall) {
    require(d.recall.pairs <= (d.seq_len - 2) / 2, "data.recall.pairs",
            "2 * pairs + 2 must fit in data.seq_len (" + n(d.seq_len) + "), got " + n(d.recall.pairs));
    require(d.recall.pairs <= d.recall.vocab_size / 2, "data.recall.pairs",
            "must be at most half of data.recall.vocab_size (" + n(d.recall.vocab_size) + "), got " +
                n(d.recall.pairs));
    require(m.vocab_size == 0 || m.vocab_size >= d.recall.vocab_size, "model.vocab_size",
            "must be 0 or at least data.recall.vocab_size (" + n(d.recall.vocab_size) + "), got " +
                n(m.vocab_size));
  }
  require(!c.run.name.empty() && c.run.name.find('/') == std::string::npos, "run.name",
          "must be a non-empty name without '/', got " + quote(c.run.name));
}

void check(const Config& config, const std::string& source) {
  Config copy = config;
  const Origin origin{source, false};
  walk(describe(copy), "", [&](const Field& f, const std::string& path) {
    const std::string problem = violation(f);
    if (!problem.empty()) origin.fail(path, problem);
  });
  check_relations(config, origin);
}

void emit(YAML::Emitter& out, const Field& section) {
  out << YAML::BeginMap;
  for (const Field& f : section.children) {
    out << YAML::Key << f.name << YAML::Value;
    if (f.is_section()) emit(out, f);
    else if (std::holds_alternative<std::string*>(f.leaf) || std::holds_alternative<Choice>(f.leaf))
      out << YAML::DoubleQuoted << scalar_text(f.leaf);
    else out << scalar_text(f.leaf);
  }
  out << YAML::EndMap;
}

Config finish(Config config, const std::string& source, const std::vector<std::string>& overrides) {
  apply_overrides(config, overrides);
  check(config, overrides.empty() ? source : source + " with --set");
  return config;
}

}  // namespace

void apply_overrides(Config& config, const std::vector<std::string>& overrides) {
  const Origin origin{"--set", false};
  const Field root = describe(config);
  for (const std::string& item : overrides) {
    const size_t eq = item.find('=');
    const std::string path = trim(item.substr(0, eq));
    if (eq == std::string::npos || path.empty()) origin.fail("", "expected key.path=value, got " + quote(item));
    const std::string value = trim(item.substr(eq + 1));
    const Field* at = &root;
    std::string at_path;
    for (size_t begin = 0; begin <= path.size();) {
      const size_t end = std::min(path.find('.', begin), path.size());
      const std::string name = path.substr(begin, end - begin);
      if (!at->is_section()) origin.fail(at_path, "is a value, it has no key " + quote(name));
      const Field* next = child(*at, name);
      if (next == nullptr) origin.fail(join(at_path, name), unknown_key(root, *at, name, false));
      at = next, at_path = join(at_path, name), begin = end + 1;
    }
    YAML::Node node;
    try {
      node = YAML::Load(value);
    } catch (const YAML::Exception& e) {
      origin.fail(path, "cannot parse value " + quote(value) + ": " + e.msg);
    }
    apply(root, *at, node, path, origin);
  }
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  Config config;
  Chain chain;
  load_file(config, path, chain, nullptr, nullptr);
  return finish(std::move(config), path, overrides);
}

Config load_config_string(const std::string& yaml, const std::string& source_name,
                          const std::vector<std::string>& overrides) {
  Config config;
  Chain chain;
  load_text(config, yaml, source_name, fs::path(source_name).parent_path(), chain);
  return finish(std::move(config), source_name, overrides);
}

const std::string& default_config_yaml() {
  static const std::string text = embedded::kDefaultConfigYaml;
  return text;
}

Config default_config(const std::vector<std::string>& overrides) {
  return load_config_string(default_config_yaml(), "<embedded default>", overrides);
}

void validate(const Config& config) { check(config, "<resolved config>"); }

namespace {
nlohmann::json section_json(const Field& section) {
  auto out = nlohmann::json::object();
  for (const Field& f : section.children) {
    if (f.is_section()) {
      out[f.name] = section_json(f);
      continue;
    }
    std::visit(
        [&](auto member) {
          if constexpr (std::is_same_v<decltype(member), Choice>) out[f.name] = member.get();
          else if constexpr (!std::is_same_v<decltype(member), std::monostate>) out[f.name] = *member;
        },
        f.leaf);
  }
  return out;
}
}  // namespace

nlohmann::json model_config_json(const ModelConfig& model) {
  ModelConfig copy = model;
  return section_json(section("model", describe(copy)));
}

nlohmann::json config_json(const Config& config) {
  Config copy = config;
  return section_json(describe(copy));
}

std::string to_yaml(const Config& config) {
  Config copy = config;
  YAML::Emitter out;
  emit(out, describe(copy));
  return std::string(out.c_str()) + "\n";
}

namespace {
std::string fnv1a_hex(const std::string& bytes) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a 64
  for (const unsigned char ch : bytes) hash = (hash ^ ch) * 1099511628211ull;
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}
}  // namespace

std::string config_hash(const Config& config) { return fnv1a_hex(to_yaml(config)); }

std::string stored_config_hash(const std::string& run_dir) {
  const auto path = (fs::path(run_dir) / "config.yaml").string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot read the run's config");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return fnv1a_hex(bytes.str());
}

std::vector<std::string> config_keys() {
  Config config;
  std::vector<std::string> keys;
  walk(describe(config), "", [&](const Field& f, const std::string& path) {
    if (!f.is_section()) keys.push_back(path);
  });
  return keys;
}

}  // namespace cqk
