// BPE training with incremental pair counts.
//
// Terms: a *word* is a distinct pre-tokenised piece of the corpus with its count, held as a
// sequence of token ids (its bytes at first); a *pair* is two adjacent ids within a word, and
// its count is the sum of the counts of the words it occurs in, once per occurrence.
// Schedule:
//   1. cut the texts into pieces and count the distinct ones (the words);
//   2. count every pair once, and note which words hold it;
//   3. repeat until the vocabulary is full: take the most frequent pair (a max-heap of
//      (count, pair) whose stale entries are skipped when popped), make it a token, rewrite only
//      the words that hold it, and apply the change in their pairs' counts (pushing the new
//      counts onto the heap).
// A merge whose bytes are already a token (reached by another pair) reuses that token.
#include <queue>
#include <unordered_map>

#include "tessel/core/error.h"
#include "tessel/text/bpe.h"

namespace tessel::text {
namespace {

using PairKey = uint64_t;  // first id << 32 | second id
PairKey key(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}

struct Word {
  std::vector<int32_t> ids;
  int64_t count = 0;
};

struct Candidate {
  int64_t count;
  PairKey pair;
  // The heap's top: highest count, then the lowest pair.
  bool operator<(const Candidate& o) const {
    return count < o.count || (count == o.count && pair > o.pair);
  }
};

std::vector<Word> count_words(const std::vector<std::string>& texts) {
  std::unordered_map<std::string_view, int64_t> counts;
  for (const std::string& t : texts) gpt2_pieces(t, [&](std::string_view p) { ++counts[p]; });
  std::vector<Word> words;
  for (const auto& [piece, count] : counts) {
    if (piece.size() < 2) continue;  // holds no pair
    Word w{std::vector<int32_t>(piece.size()), count};
    for (size_t i = 0; i < piece.size(); ++i) w.ids[i] = static_cast<uint8_t>(piece[i]);
    words.push_back(std::move(w));
  }
  return words;
}

// Replaces each occurrence of (a, b) in ids by `merged`, left to right; adds -count for every
// pair that goes and +count for every pair that comes to delta. False when (a, b) is absent.
bool merge_word(Word& w, int32_t a, int32_t b, int32_t merged,
                std::unordered_map<PairKey, int64_t>& delta) {
  std::vector<int32_t>& ids = w.ids;
  bool found = false;
  for (size_t i = 0; i + 1 < ids.size() && !found; ++i) found = ids[i] == a && ids[i + 1] == b;
  if (!found) return false;
  for (size_t i = 0; i + 1 < ids.size(); ++i) delta[key(ids[i], ids[i + 1])] -= w.count;
  size_t out = 0;
  for (size_t i = 0; i < ids.size(); ++out) {
    const bool pair = i + 1 < ids.size() && ids[i] == a && ids[i + 1] == b;
    ids[out] = pair ? merged : ids[i];
    i += pair ? 2 : 1;
  }
  ids.resize(out);
  for (size_t i = 0; i + 1 < ids.size(); ++i) delta[key(ids[i], ids[i + 1])] += w.count;
  return true;
}

}  // namespace

BpeTokenizer train_bpe(const std::vector<std::string>& texts, const BpeTrainOptions& options) {
  if (options.vocab_size < 256 || options.vocab_size > (int64_t{1} << 30))
    throw InvalidArgument(str("tokenizer: vocabulary size must be in [256, 2^30], got ",
                              options.vocab_size, "; give --vocab of 256 (the bytes) or more"));
  std::vector<std::string> tokens(256);
  std::unordered_map<std::string, int32_t> id_of;
  for (int b = 0; b < 256; ++b) id_of[tokens[b] = std::string(1, static_cast<char>(b))] = b;

  std::vector<Word> words = count_words(texts);
  std::unordered_map<PairKey, int64_t> count;
  std::unordered_map<PairKey, std::vector<int32_t>> where;  // may list a word twice, or stale
  for (size_t w = 0; w < words.size(); ++w)
    for (size_t i = 0; i + 1 < words[w].ids.size(); ++i) {
      const PairKey p = key(words[w].ids[i], words[w].ids[i + 1]);
      count[p] += words[w].count;
      where[p].push_back(static_cast<int32_t>(w));
    }
  std::priority_queue<Candidate> heap;
  for (const auto& [p, c] : count) heap.push({c, p});

  std::vector<int64_t> seen(words.size(), -1);  // the step that last rewrote each word
  std::unordered_map<PairKey, int64_t> delta;
  for (int64_t step = 0; static_cast<int64_t>(tokens.size()) < options.vocab_size; ++step) {
    while (!heap.empty()) {  // skip entries whose count has changed since they were pushed
      const auto it = count.find(heap.top().pair);
      if (it != count.end() && it->second == heap.top().count) break;
      heap.pop();
    }
    if (heap.empty() || heap.top().count < options.min_count) break;
    const PairKey p = heap.top().pair;
    heap.pop();
    const auto a = static_cast<int32_t>(p >> 32), b = static_cast<int32_t>(p & 0xffffffffu);
    std::string bytes = tokens[a] + tokens[b];
    auto [it, fresh] = id_of.emplace(bytes, static_cast<int32_t>(tokens.size()));
    if (fresh) tokens.push_back(std::move(bytes));
    const int32_t merged = it->second;

    delta.clear();
    std::vector<int32_t> holders = std::move(where[p]);
    where.erase(p);
    for (int32_t w : holders) {
      if (seen[w] == step || !merge_word(words[w], a, b, merged, delta)) continue;
      seen[w] = step;
      const std::vector<int32_t>& ids = words[w].ids;
      for (size_t i = 0; i + 1 < ids.size(); ++i)
        if (ids[i] == merged || ids[i + 1] == merged) where[key(ids[i], ids[i + 1])].push_back(w);
    }
    for (const auto& [q, d] : delta) {
      if (d == 0) continue;
      const int64_t c = count[q] += d;
      if (c > 0)
        heap.push({c, q});
      else
        count.erase(q);
    }
  }
  return BpeTokenizer(std::move(tokens));
}

}  // namespace tessel::text
