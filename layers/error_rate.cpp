// Edit distance and the corpus error rate (see error_rate.h).
#include "layers/error_rate.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace clustr {

int64_t edit_distance(const LabelSequence& reference, const LabelSequence& hypothesis) {
  // One row of the DP table: row[j] = distance(reference[0, i), hypothesis[0, j)).
  const size_t n = hypothesis.size();
  std::vector<int64_t> row(n + 1);
  for (size_t j = 0; j <= n; ++j) row[j] = static_cast<int64_t>(j);
  for (size_t i = 1; i <= reference.size(); ++i) {
    int64_t diagonal = row[0];  // distance(reference[0, i-1), hypothesis[0, j-1))
    row[0] = static_cast<int64_t>(i);
    for (size_t j = 1; j <= n; ++j) {
      const int64_t substitute = diagonal + (reference[i - 1] != hypothesis[j - 1]);
      diagonal = row[j];
      row[j] = std::min({substitute, row[j] + 1, row[j - 1] + 1});
    }
  }
  return row[n];
}

void ErrorRate::add(const LabelSequence& reference, const LabelSequence& hypothesis) {
  edits += edit_distance(reference, hypothesis);
  reference_length += static_cast<int64_t>(reference.size());
}

void ErrorRate::add(const std::vector<LabelSequence>& references,
                    const std::vector<LabelSequence>& hypotheses) {
  CLUSTR_CHECK(references.size() == hypotheses.size(), "ErrorRate::add: ", references.size(),
               " references but ", hypotheses.size(), " hypotheses");
  for (size_t i = 0; i < references.size(); ++i) add(references[i], hypotheses[i]);
}

double ErrorRate::rate() const {
  if (reference_length == 0) return edits == 0 ? 0.0 : INFINITY;
  return static_cast<double>(edits) / static_cast<double>(reference_length);
}

double error_rate(const std::vector<LabelSequence>& references,
                  const std::vector<LabelSequence>& hypotheses) {
  ErrorRate r;
  r.add(references, hypotheses);
  return r.rate();
}

}  // namespace clustr
