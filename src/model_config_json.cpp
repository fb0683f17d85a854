#include "model_config_json.h"

namespace cqk {

nlohmann::json model_config_json(const ModelConfig& m) {
  const auto& a = m.attention;
  const auto& cp = a.coupling;
  return {{"vocab_size", m.vocab_size},
          {"width", m.width},
          {"layers", m.layers},
          {"heads", m.heads},
          {"kv_heads", m.kv_heads},
          {"mlp", m.mlp},
          {"mlp_hidden", m.mlp_hidden},
          {"rope_base", m.rope_base},
          {"init_std", m.init_std},
          {"norm_eps", m.norm_eps},
          {"attention",
           {{"kind", a.kind},
            {"coupling",
             {{"kind", cp.kind},
              {"hidden", cp.hidden},
              {"steps", cp.steps},
              {"clamp", cp.clamp},
              {"shared_across_heads", cp.shared_across_heads},
              {"separate_pairs", cp.separate_pairs},
              {"integrator", cp.integrator},
              {"dt_init", cp.dt_init},
              {"recompute_from_inverse", cp.recompute_from_inverse}}},
            {"mta",
             {{"every", a.mta.every},
              {"query_kernel", a.mta.query_kernel},
              {"key_kernel", a.mta.key_kernel},
              {"head_group", a.mta.head_group}}}}}};
}

}  // namespace cqk
