#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cqk/config_loader.h"
#include "kind_choices.h"

namespace {

namespace fs = std::filesystem;

// A fresh folder for config files, removed at the end of the test. POSIX calls,
// not std::filesystem's: libtorch.so exports broken copies of remove_all and co.
class ConfigFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "cqk-config-XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    ::nftw(dir_.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
           FTW_DEPTH | FTW_PHYS);
  }

  // Writes dir_/name (one folder level at most) and returns its path.
  std::string write(const std::string& name, const std::string& text) {
    const fs::path path = dir_ / name;
    ::mkdir(path.parent_path().c_str(), 0755);
    std::ofstream(path) << text;
    return path.string();
  }

  fs::path dir_;
};

using cqk::testing::choices;

// The message of the ConfigError that `fn` throws ("" and a failure if none).
std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const cqk::ConfigError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return "";
}

std::string load_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { cqk::load_config_string(yaml, "test.yaml", overrides); });
}

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST(ConfigLoader, EmptyDocumentGivesStructDefaults) {
  const cqk::Config c = cqk::load_config_string("", "empty.yaml");
  const cqk::Config d;
  EXPECT_EQ(cqk::to_yaml(c), cqk::to_yaml(d));
  EXPECT_EQ(c.model.width, 128);
  EXPECT_EQ(cqk::to_string(c.model.attention.coupling().kind()), "affine");
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_NO_THROW(cqk::validate(d));
}

TEST(ConfigLoader, EmbeddedDefaultParsesAndValidates) {
  const cqk::Config c = cqk::default_config();
  EXPECT_NO_THROW(cqk::validate(c));
  EXPECT_EQ(cqk::to_string(c.data.kind), "recall");
  EXPECT_EQ(cqk::to_string(c.model.attention.kind()), "vanilla");
  EXPECT_EQ(cqk::to_string(c.model.attention.coupling().kind()), "affine");
  // The embedded text is configs/default.yaml as it is in the source tree.
  const cqk::Config from_file = cqk::load_config(std::string(CQK_SOURCE_DIR) + "/configs/default.yaml");
  EXPECT_EQ(cqk::config_hash(c), cqk::config_hash(from_file));
  EXPECT_EQ(cqk::default_config({"train.steps=7"}).train.steps, 7);
}

// The defaults of cqk/config.h are configs/default.yaml's values, every key
// of them: a config file that leaves a key out gets what `cqk train` without a
// file gets.
TEST(ConfigLoader, StructDefaultsAreTheEmbeddedDefault) {
  EXPECT_EQ(cqk::to_yaml(cqk::Config{}), cqk::to_yaml(cqk::default_config()));
}

// Every key of the struct is written out explicitly in the default file.
TEST(ConfigLoader, DefaultFileNamesEveryKey) {
  const std::string& text = cqk::default_config_yaml();
  for (const std::string& key : cqk::config_keys()) {
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_HAS(text, "  " + leaf + ":");
  }
}

TEST(ConfigLoader, EveryFileUnderConfigsLoadsAndValidates) {
  int count = 0;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(CQK_SOURCE_DIR) / "configs")) {
    if (!entry.is_regular_file() || (entry.path().extension() != ".yaml" && entry.path().extension() != ".yml"))
      continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW(cqk::validate(cqk::load_config(entry.path().string())));
    ++count;
  }
  EXPECT_GE(count, 3);
}

TEST_F(ConfigFiles, ConfigInheritDeepMergesChains) {
  write("base/base.yaml",
        "model:\n  width: 64\n  heads: 4\n  attention:\n    kind: qknorm\n"
        "    coupling: {kind: affine, hidden: 4, clamp: 1.5}\n"
        "train: {lr: 1.0e-3, steps: 50}\n");
  write("mid.yaml", "inherit: base/base.yaml\nmodel:\n  attention:\n    coupling:\n      hidden: 16\n");
  const std::string leaf = write("sub/leaf.yaml",
                                 "inherit: ../mid.yaml\ntrain:\n  steps: 60\nrun: {name: leaf}\n");
  const cqk::Config c = cqk::load_config(leaf);
  EXPECT_EQ(c.model.width, 64);                        // from base
  EXPECT_EQ(cqk::to_string(c.model.attention.kind()), "qknorm");         // from base
  EXPECT_EQ(cqk::to_string(c.model.attention.coupling().kind()), "affine");
  EXPECT_EQ(c.model.attention.coupling().hidden(), 16);    // mid over base
  EXPECT_DOUBLE_EQ(c.model.attention.coupling().clamp(), 1.5);
  EXPECT_EQ(c.train.steps, 60);                        // leaf over base
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);                  // base, sibling of an overridden key
  EXPECT_EQ(c.run.name, "leaf");
  EXPECT_EQ(c.model.layers, cqk::Config{}.model.layers);  // nobody set it
}

TEST_F(ConfigFiles, ConfigInheritCycleIsAnError) {
  write("a.yaml", "inherit: b.yaml\n");
  write("b.yaml", "inherit: c.yaml\n");
  const std::string c = write("c.yaml", "inherit: a.yaml\n");
  const std::string message = error_of([&] { cqk::load_config(c); });
  EXPECT_HAS(message, "cycle");
  EXPECT_HAS(message, "a.yaml");
  EXPECT_HAS(message, "b.yaml");
  const std::string self = write("self.yaml", "inherit: self.yaml\n");
  EXPECT_HAS(error_of([&] { cqk::load_config(self); }), "cycle");
}

TEST_F(ConfigFiles, ConfigMissingFilesAreNamed) {
  const std::string missing = (dir_ / "nope.yaml").string();
  const std::string message = error_of([&] { cqk::load_config(missing); });
  EXPECT_HAS(message, missing);
  EXPECT_HAS(message, "cannot read");
  const std::string child = write("child.yaml", "inherit: gone.yaml\n");
  const std::string inherited = error_of([&] { cqk::load_config(child); });
  EXPECT_HAS(inherited, child + ": inherit: cannot read");
  EXPECT_HAS(inherited, "gone.yaml");
  EXPECT_HAS(error_of([&] { cqk::load_config(dir_.string()); }), "is a directory");
}

TEST_F(ConfigFiles, ConfigErrorsInABaseNameTheBaseFile) {
  const std::string base = write("base.yaml", "model:\n  attention:\n    coupling:\n      kind: afine\n");
  const std::string child = write("child.yaml", "inherit: base.yaml\n");
  const std::string message = error_of([&] { cqk::load_config(child); });
  EXPECT_EQ(message, base + ": model.attention.coupling.kind: expected one of " +
                         choices(cqk::coupling_kind_names()) + ", got 'afine' (line 4)");
}

TEST(ConfigLoader, ConfigMalformedYamlGivesLineAndColumn) {
  const std::string message = load_error("model:\n  width: 64\n  heads: [4\ntrain: {}\n");
  EXPECT_EQ(message.rfind("test.yaml:", 0), 0u) << message;
  EXPECT_HAS(message, "invalid YAML");
  EXPECT_EQ(load_error("run:\n  name: a: b\n"), "test.yaml:2:10: invalid YAML: illegal map value");
  EXPECT_EQ(load_error("model:\n  width: 64\n bad: 1\n"), "test.yaml:3:2: invalid YAML: end of map not found");
}

TEST(ConfigLoader, ConfigUnknownKeySuggestsTheClosest) {
  const std::string message = load_error("train:\n  lrr: 0.1\n");
  EXPECT_HAS(message, "test.yaml: train.lrr: unknown key");
  EXPECT_HAS(message, "did you mean 'lr'?");
  EXPECT_HAS(message, "(line 2)");
  EXPECT_HAS(load_error("model:\n  attention:\n    coupling:\n      hiden: 3\n"),
             "model.attention.coupling.hiden: unknown key, did you mean 'hidden'?");
  EXPECT_HAS(load_error("modle:\n  width: 3\n"), "modle: unknown key, did you mean 'model'?");
  // A key that exists in another section is pointed to by its full path.
  EXPECT_HAS(load_error("train:\n  seq_len: 128\n"), "did you mean 'data.seq_len'?");
  EXPECT_HAS(load_error("model:\n  coupling:\n    kind: affine\n"),
             "model.coupling: unknown key, did you mean 'model.attention.coupling'?");
  // Nothing close: the valid keys are listed.
  EXPECT_HAS(load_error("run:\n  zzzzzzzz: 1\n"), "valid keys: name, dir, seed");
  EXPECT_HAS(load_error("model:\n  inherit: x.yaml\n"), "model.inherit: unknown key");
}

TEST(ConfigLoader, ConfigWrongTypesNameTheKey) {
  const std::pair<const char*, const char*> cases[] = {
      {"train:\n  lr: fast\n", "test.yaml: train.lr: expected a number, got 'fast'"},
      {"train:\n  lr: \"1e-3\"\n", "train.lr: expected a number, got the quoted string"},
      {"model:\n  width: 12.5\n", "model.width: expected an integer, got '12.5'"},
      {"model:\n  width: {a: 1}\n", "model.width: expected an integer, got a map"},
      {"model:\n  width: [1, 2]\n", "model.width: expected an integer, got a list"},
      {"model:\n  width:\n", "model.width: expected an integer, got nothing"},
      {"model:\n  attention: vanilla\n", "model.attention: expected a map of keys"},
      {"train:\n  decay_embeddings: maybe\n", "train.decay_embeddings: expected true or false"},
      {"run:\n  name: [a]\n", "run.name: expected a string, got a list"},
      {"- 1\n- 2\n", "test.yaml: expected a map of keys, got a list"},
      {"inherit: [a.yaml]\n", "test.yaml: inherit: expected a file name"},
      {"train:\n  lr: 1.0\n  lr: 2.0\n", "train.lr: duplicate key"},
  };
  for (const auto& [yaml, message] : cases) EXPECT_HAS(load_error(yaml), message);
}

// A long value keeps its start and its end; the middle gives way.
TEST(ConfigLoader, ConfigLongValuesAreCutInTheMiddle) {
  const std::string value = "start-" + std::string(100, 'x') + "-end";
  EXPECT_HAS(load_error("run:\n  seed: " + value + "\n"),
             "run.seed: expected an integer, got 'start-" + std::string(24, 'x') + "..." + std::string(26, 'x') +
                 "-end'");
}

TEST(ConfigLoader, ConfigIntegersAcceptIntegralFloatLiterals) {
  const cqk::Config c = cqk::load_config_string("data:\n  recall:\n    train_examples: 1e5\n  seq_len: 128.0\n", "t");
  EXPECT_EQ(c.data.recall.train_examples, 100000);
  EXPECT_EQ(c.data.seq_len, 128);
  EXPECT_EQ(cqk::load_config_string("run: {seed: 010}", "t").run.seed, 10);  // decimal, never octal
}

TEST(ConfigLoader, ConfigRangeErrorsAtLoadNameTheFileAndKey) {
  EXPECT_HAS(load_error("train:\n  lr: 0\n"), "test.yaml: train.lr: must be > 0, got 0.0");
  EXPECT_HAS(load_error("model:\n  attention:\n    coupling:\n      steps: 9\n"),
             "model.attention.coupling.steps: must be in [1, 8], got 9");
  EXPECT_HAS(load_error("train:\n  beta2: 1.0\n"), "train.beta2: must be in [0, 1), got 1.0");
  EXPECT_HAS(load_error("train:\n  lr: .nan\n"), "train.lr: must be finite");
  // Cross-key checks run on the resolved config and name the loaded source.
  EXPECT_HAS(load_error("model:\n  heads: 3\n"), "test.yaml: model.heads: must divide model.width (128), got 3");
}

TEST(ConfigLoader, ConfigSetOverridesEveryType) {
  const cqk::Config c = cqk::default_config({"model.width=256", "train.lr=1e-3",
                                             "model.attention.coupling.kind=noninvertible",
                                             "train.decay_embeddings=true", "run.name = spaced ",
                                             "model.attention.coupling={hidden: 4, clamp: 3.5}"});
  EXPECT_EQ(c.model.width, 256);
  EXPECT_DOUBLE_EQ(c.train.lr, 1e-3);
  EXPECT_EQ(cqk::to_string(c.model.attention.coupling().kind()), "noninvertible");
  EXPECT_TRUE(c.train.decay_embeddings);
  EXPECT_EQ(c.run.name, "spaced");
  EXPECT_EQ(c.model.attention.coupling().hidden(), 4);
  EXPECT_DOUBLE_EQ(c.model.attention.coupling().clamp(), 3.5);
  // Later overrides win over earlier ones and over the file.
  EXPECT_EQ(cqk::default_config({"train.steps=5", "train.steps=6"}).train.steps, 6);
}

TEST(ConfigLoader, ConfigSetErrorsNameTheSource) {
  EXPECT_HAS(load_error("", {"train.lrr=1"}), "--set: train.lrr: unknown key, did you mean 'lr'?");
  EXPECT_HAS(load_error("", {"trian.lr=1"}), "--set: trian: unknown key, did you mean 'train'?");
  EXPECT_HAS(load_error("", {"train.lr=abc"}), "--set: train.lr: expected a number, got 'abc'");
  EXPECT_HAS(load_error("", {"model.attention.coupling.kind=afine"}),
             "--set: model.attention.coupling.kind: expected one of " + choices(cqk::coupling_kind_names()));
  EXPECT_HAS(load_error("", {"train.lr"}), "--set: expected key.path=value, got 'train.lr'");
  EXPECT_HAS(load_error("", {"train.lr.x=1"}), "--set: train.lr: is a value");
  EXPECT_HAS(load_error("", {"train.lr=[1"}), "--set: train.lr: cannot parse value");
  EXPECT_HAS(load_error("", {"model.heads=3"}), "test.yaml with --set: model.heads: must divide");
}

TEST(ConfigLoader, ConfigToYamlRoundTrips) {
  const cqk::Config c = cqk::default_config({"train.lr=0.00033333333333333333", "model.norm_eps=1e-6",
                                             "run.name=yes", "data.dir=null", "run.dir='a: b # c'",
                                             "model.attention.coupling.dt_init=-0.125",
                                             "model.rope_base=500000", "train.decay_embeddings=on"});
  EXPECT_EQ(c.run.name, "yes");
  EXPECT_EQ(c.data.dir, "");
  EXPECT_EQ(c.run.dir, "a: b # c");
  const std::string text = cqk::to_yaml(c);
  const cqk::Config back = cqk::load_config_string(text, "round-trip.yaml");
  EXPECT_EQ(cqk::to_yaml(back), text);
  EXPECT_EQ(cqk::config_hash(back), cqk::config_hash(c));
  EXPECT_EQ(back.train.lr, c.train.lr);  // bit-exact
  EXPECT_EQ(back.model.norm_eps, c.model.norm_eps);
  EXPECT_EQ(back.model.attention.coupling().dt_init(), -0.125);
  EXPECT_EQ(back.model.rope_base, 500000.0);
  EXPECT_EQ(back.run.name, "yes");
  EXPECT_EQ(back.run.dir, "a: b # c");
  EXPECT_TRUE(back.train.decay_embeddings);
  // Every key is written, floats keep a '.' for YAML 1.1 readers.
  for (const std::string& key : cqk::config_keys()) EXPECT_HAS(text, key.substr(key.rfind('.') + 1) + ":");
  EXPECT_HAS(text, "norm_eps: 1.0e-06");
  EXPECT_HAS(text, "rope_base: 500000.0");
}

TEST(ConfigLoader, ConfigHashIsStableHex) {
  const cqk::Config a = cqk::default_config();
  const std::string hash = cqk::config_hash(a);
  EXPECT_EQ(hash.size(), 16u);
  EXPECT_EQ(hash.find_first_not_of("0123456789abcdef"), std::string::npos);
  EXPECT_EQ(hash, cqk::config_hash(cqk::default_config()));
  EXPECT_NE(hash, cqk::config_hash(cqk::default_config({"run.seed=2"})));
}

TEST(ConfigLoader, ConfigValidateCatchesInconsistentValues) {
  const auto validate_error = [](const std::function<void(cqk::Config&)>& change) {
    cqk::Config c;
    change(c);
    return error_of([&] { cqk::validate(c); });
  };
  EXPECT_EQ(validate_error([](cqk::Config& c) { c.model.heads = 5; }),
            "<resolved config>: model.heads: must divide model.width (128), got 5");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.kv_heads = 3; }), "model.kv_heads: must divide");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.width = 0; }), "model.width: must be >= 1, got 0");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.train.lr = -1; }), "train.lr: must be > 0");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.train.steps = 0; }), "train.steps: must be >= 1");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.data.seq_len = 1; }), "data.seq_len: must be >= 2");
  // An unknown kind cannot be held by a Config (an enum): loading refuses it.
  EXPECT_HAS(error_of([] { cqk::default_config({"model.attention.kind=flash"}); }),
             "model.attention.kind: expected one of " + choices(cqk::attention_kind_names()) + ", got 'flash'");
  for (const auto& [key, names] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {"model.mlp", cqk::kind_names<cqk::kMlpKindNames>()},
           {"data.kind", cqk::kind_names<cqk::kDataKindNames>()},
           {"train.schedule", cqk::kind_names<cqk::kLrScheduleNames>()},
           {"train.device", cqk::kind_names<cqk::kDeviceChoiceNames>()},
           {"train.dtype", cqk::kind_names<cqk::kPrecisionNames>()}}) {
    EXPECT_EQ(error_of([&] { cqk::default_config({key + "=relu"}); }),
              "--set: " + key + ": expected one of " + choices(names) + ", got 'relu'");
    for (const auto& name : names)  // every name loads and is written back as itself
      EXPECT_HAS(cqk::to_yaml(cqk::default_config({key + "=" + name, "data.dir=d"})),
                 key.substr(key.find('.') + 1) + ": \"" + name + "\"");
  }
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.attention.mta().key_kernel() = 10; }),
             "model.attention.mta.key_kernel: must be odd");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.attention.mta().query_kernel() = 0; }),
             "model.attention.mta.query_kernel: must be >= 1");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.attention.coupling().hidden() = 0; }),
             "model.attention.coupling.hidden: must be >= 1");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.attention.coupling().clamp() = 0; }),
             "model.attention.coupling.clamp: must be > 0");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.model.attention.coupling().steps() = 0; }),
             "model.attention.coupling.steps: must be in [1, 8]");
  EXPECT_HAS(validate_error([](cqk::Config& c) {
               c.model.attention.kind() = cqk::AttentionKind::Differential;
               c.model.heads = 1;
               c.model.width = 64;
             }),
             "model.heads: diff attention needs an even head count, got 1");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.data.kind = cqk::DataKind::Tokens; }), "data.dir: required");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.train.warmup_steps = -1; }), "train.warmup_steps");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.data.recall.pairs = 40; }), "data.recall.pairs");
  EXPECT_HAS(validate_error([](cqk::Config& c) { c.run.name = ""; }), "run.name");
}

TEST(ConfigLoader, ConfigKeysListEveryLeaf) {
  const std::vector<std::string> keys = cqk::config_keys();
  EXPECT_EQ(keys.front(), "run.name");
  EXPECT_NE(std::find(keys.begin(), keys.end(), "model.attention.coupling.kind"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "data.recall.power_law"), keys.end());
  EXPECT_NE(std::find(keys.begin(), keys.end(), "train.threads"), keys.end());
}

}  // namespace
