// Registration of the per-family files (src/model/<family>.cc) into the architecture table.
#pragma once

#include <vector>

#include "model/arch.h"

namespace shoal {

/// Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3 (src/model/llama.cc).
std::vector<ArchInfo> llama_family();

}  // namespace shoal
