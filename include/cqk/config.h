#pragma once
// The experiment configuration: plain structs with defaults, filled from YAML
// (`inherit:` for a base file, `--set key.path=value` overrides) and written
// back fully resolved into the run directory. Every field but the attention's
// shape is a YAML key of the same name under its section
// (model.attention.coupling.kind, train.lr, ...); kinds are enums, named in the
// config by their kind tables. Torch-free.
// The defaults are configs/default.yaml's values, whose comments say why;
// ConfigLoader.StructDefaultsAreTheEmbeddedDefault checks every field.
#include <cstdint>
#include <string>
#include <vector>

#include "cqk/attention_options.h"
#include "cqk/coupling_options.h"
#include "cqk/kind_table.h"
#include "cqk/sdpa_backend.h"

namespace cqk {

// The config's own kinds; a module's kinds sit with its options
// (coupling_options.h, attention_options.h, sdpa_backend.h).
enum class MlpKind { Gelu, SwiGlu };
inline const KindTable<MlpKind, 2> kMlpKindNames = {{MlpKind::Gelu, "gelu"}, {MlpKind::SwiGlu, "swiglu"}};
inline std::string to_string(MlpKind kind) { return kind_name(kMlpKindNames, kind); }

enum class DataKind {
  Recall,  // the associative-recall task, generated in memory
  Tokens,  // token files from `cqk data encode`
};
inline const KindTable<DataKind, 2> kDataKindNames = {{DataKind::Recall, "recall"}, {DataKind::Tokens, "tokens"}};
inline std::string to_string(DataKind kind) { return kind_name(kDataKindNames, kind); }

enum class LrSchedule { Cosine, WarmupStableDecay, Constant };  // all after a linear warmup (schedule.h)
inline const KindTable<LrSchedule, 3> kLrScheduleNames = {
    {LrSchedule::Cosine, "cosine"}, {LrSchedule::WarmupStableDecay, "wsd"}, {LrSchedule::Constant, "constant"}};

enum class DeviceChoice { Auto, Cpu, Cuda };  // auto: a GPU when one is visible (device.h)
inline const KindTable<DeviceChoice, 3> kDeviceChoiceNames = {
    {DeviceChoice::Auto, "auto"}, {DeviceChoice::Cpu, "cpu"}, {DeviceChoice::Cuda, "cuda"}};

enum class Precision { Auto, Fp32, Bf16 };  // auto: bf16 autocast on CUDA, fp32 on the CPU
inline const KindTable<Precision, 3> kPrecisionNames = {
    {Precision::Auto, "auto"}, {Precision::Fp32, "fp32"}, {Precision::Bf16, "bf16"}};

struct ModelConfig {
  int64_t vocab_size = 0;             // 0: taken from the data
  int64_t width = 128;
  int64_t layers = 2;
  int64_t heads = 4;
  int64_t kv_heads = 0;               // 0: same as heads
  MlpKind mlp = MlpKind::SwiGlu;      // gelu | swiglu
  int64_t mlp_hidden = 0;             // 0: 4*width (gelu) or 8/3*width rounded up to 64 (swiglu)
  double rope_base = 10000.0;
  double init_std = 0.02;
  double norm_eps = 1e-5;
  // model.attention: kind, head_norm_init, coupling and mta are keys; the shape fields
  // (width, heads, ...) are set per layer from the keys above (attention_options()).
  AttentionOptions attention;
};

struct RecallConfig {
  int64_t vocab_size = 64;            // keys from the lower half, values from the upper half
  int64_t pairs = 4;                  // key-value pairs per sequence
  double power_law = 0.1;             // query placement exponent (Zoology's alpha)
  int64_t train_examples = 20000;     // distinct training sequences (cycled)
  int64_t eval_examples = 1000;
};

struct DataConfig {
  DataKind kind = DataKind::Recall;   // recall (generated, no download) | tokens (files from `cqk data encode`)
  std::string dir;                    // tokens: folder with train.bin, valid.bin, test.bin
  int64_t seq_len = 32;
  int64_t batch_size = 64;            // global batch in sequences (per step, before accumulation)
  int64_t eval_stride = 0;            // evaluation window stride; 0: seq_len (non-overlapping)
  int64_t prefetch = 2;               // batches prepared ahead on a background thread
  RecallConfig recall;
};

struct TrainConfig {
  int64_t steps = 300;
  double lr = 1e-3;                   // 3e-3 stalls recall at ~25% accuracy
  double min_lr_ratio = 0.1;          // final lr = lr * min_lr_ratio
  int64_t warmup_steps = 30;
  LrSchedule schedule = LrSchedule::Cosine;  // cosine | wsd | constant
  double decay_fraction = 0.2;        // wsd: last fraction of steps that decays
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;             // 0: off
  int64_t grad_accum = 1;
  bool decay_norms_and_biases = false;
  bool decay_embeddings = false;
  double coupling_lr_scale = 1.0;     // the coupling's parameters train at lr times this
  bool decay_coupling = true;         // weight decay on the coupling's matrices (as on other matrices)
  int64_t eval_every = 100;
  int64_t eval_batches = 20;          // 0: the whole split
  int64_t log_every = 10;
  int64_t checkpoint_every = 100;
  int64_t keep_checkpoints = 2;
  DeviceChoice device = DeviceChoice::Auto;  // auto | cpu | cuda
  Precision dtype = Precision::Auto;  // auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16
  SdpaBackend sdpa_backend = SdpaBackend::Auto;  // auto | cudnn | flash | efficient | math (sdpa_backend.h)
  int64_t threads = 0;                // 0: all available cores
};

struct LogConfig {
  bool tensorboard = true;            // RUN/tb/: TensorBoard event files, written live (rank 0)
};

struct RunConfig {
  std::string name = "default";
  std::string dir;                    // empty: runs/<name>-seed<seed>
  int64_t seed = 1;
};

struct Config {
  RunConfig run;
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  LogConfig log;
};

}  // namespace cqk
