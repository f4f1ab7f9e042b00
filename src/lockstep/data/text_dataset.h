// Byte-level text for a language model: a text file (`--data FILE`) or, by default, the
// English fortunes of Debian's `fortunes` package, read as bytes (vocabulary 256, so there is
// no tokenizer to install), split into train and validation, and cut into fixed windows.
//
// The windows come out as an ordinary TensorDataset, so the DataLoader batches text exactly
// as it batches images: "tokens" holds the windows, i64 [N, T], and "targets" the next
// bytes, i64 [N, T] (the tokens shifted by one); each epoch's order is the same epoch_order(N, seed, epoch)
// permutation, batches carry first_position and the global sample indices, and a checkpoint's
// LoaderPosition resumes them. The validation set is read in order with shuffle = false.
//
// Split: the text is cut into records at lines holding only "%" (the fortune separator), and
// every tenth record (the 10th, 20th, ...) goes to validation, so validation and training
// share no record and both sample every fortune file. A text with fewer than ten records (a
// plain file) gives its last tenth of bytes to validation instead. Each part's windows lie
// wholly inside that part, so no validation byte is ever a training input or target.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lockstep/data/dataset.h"

namespace lockstep {

inline constexpr const char* kFortunesDefaultDir = "/usr/share/games/fortunes";
inline constexpr int64_t kByteVocabulary = 256;
inline constexpr int64_t kValidationEvery = 10;  // one record in ten, or the last tenth of a plain text

// The English fortunes in `dir`: every regular file directly in it except the `.dat` indexes,
// in name order. The `.u8` names are symlinks to the same files and are skipped, as are the
// subdirectories other packages add (`off/` for fortunes-off, one per language). Debian's
// `fortunes` and `fortunes-min` packages install these files. An Error says how to install
// them when there are none.
std::vector<std::string> fortune_files(const std::string& dir = kFortunesDefaultDir);

// The bytes of one file; an Error naming the path and the fix when it cannot be read.
std::string read_text_file(const std::string& path);

struct TextSplits {
  std::string train;
  std::string validation;
};

// The split described above. Records keep their bytes, each followed by a "%\n" line (the
// separator the model learns to emit), so splitting a fortune file only reorders its records.
TextSplits split_text(const std::string& text);

// `data_path` read as one text, or, when it is empty, the fortunes files concatenated; then split.
TextSplits load_text(const std::string& data_path = "");

// Windows of a text at stride `context`: sample i reads bytes [i*T, i*T + T + 1), its tokens
// the first T and its targets the last T. Windows overlap in one byte only (the last target of
// one is the first token of the next), so every byte but the first is a target exactly once,
// up to the (bytes - 1) % T left over at the end, which no window reads.
// N = (bytes - 1) / T; a text too short for one window is an Error.
int64_t text_window_count(int64_t bytes, int64_t context);

// The windows as a dataset of "tokens" and "targets", both i64 [N, T]: views of one i64 copy
// of the text (8 bytes per byte of text), offset by one element.
inline constexpr const char* kTokensField = "tokens";
inline constexpr const char* kTargetsField = "targets";
TensorDataset text_windows(const std::string& text, int64_t context);

}  // namespace lockstep
