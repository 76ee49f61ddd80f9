// The paper's Figure 8: the attention weights one head of a trained speech model gives one
// utterance, under full, clustered and improved-clustered attention, side by side.
#pragma once

#include <cstdint>
#include <string>

#include "apps/speech/model.h"
#include "data/speech_batch.h"

namespace clustr::speech {

// Runs `example` through the model (evaluation mode) up to encoder layer `layer`, takes that
// layer's queries and keys of head `head`, and writes the dense (T, T) weights of each type
// (layers/attention attention_matrix(); the clustered types cluster the queries with
// `attention`'s C, bits and iterations, hashing keyed by `seed`) as one PNG: square panels left
// to right (full | clustered | improved-clustered, and the model's own type when it shares one
// projection between queries and keys: shared-full or lsh-X, through shared_attention_matrix),
// rows = queries top to bottom, columns = keys; colour = viridis of sqrt(weight / the largest
// weight of the panels), so that the small weights stay visible. Throws on a bad layer or head,
// or when the file cannot be written.
void write_attention_maps(SpeechModel& model, const AttentionConfig& attention,
                          const SpeechExample& example, int layer, int head, uint64_t seed,
                          const std::string& path);

}  // namespace clustr::speech
