// Prompt in, text out on stdout: shared by `shoal run` (one process or --pool) and `shoal host`.
#pragma once

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "runtime/session.h"
#include "tokenizer/tokenizer.h"

namespace shoal::app {

/// Token ids of a prompt: BOS added as the model asks, special-token text parsed; an empty
/// prompt is just BOS. Errors: kInvalidArgument when it is empty and the model has no BOS.
Result<std::vector<int32_t>> encode_prompt(const Tokenizer& tok, const std::string& prompt);

/// Something that generates: Session::generate or pool::Host::generate.
using GenerateFn = std::function<Result<std::vector<int32_t>>(std::span<const int32_t>, const GenerateOptions&,
                                                              const TokenCallback&, GenerateStats*)>;

/// Generates from `ids`, streaming the text to stdout (or, with output_ids, printing the ids as one
/// JSON array), ending with a newline; logs the prompt and decode speed on stderr.
Status generate_to_stdout(const Tokenizer& tok, std::span<const int32_t> ids, const GenerateOptions& go,
                          bool output_ids, const GenerateFn& generate);

}  // namespace shoal::app
