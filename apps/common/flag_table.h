// An app's settings, each declared once in a table: the command-line flag (its name without the
// dashes is also its key in the configuration table and in checkpoints), its help, the field it
// sets, the check of its value, and what a resumed run may do with it. The table makes the
// CLI11 flags, checks the values, prints the configuration table, writes and reads a
// checkpoint's config, and says which settings a resume must keep.
//
//   FlagTable t;
//   t.add("layers", m.layers, "encoder layers").at_least(1).resume(Resume::locked);
//   t.add_to(app);                 // the flags, in declaration order
//   t.validate();                  // "--layers must be >= 1, got 0"
//   t.entries();                   // {("layers", "2"), ...}: the config table and checkpoint
//   t.apply(config, {"layers"});   // the fields from a checkpoint's config
//
// A table holds references to the fields it was built over: build it over the options it is
// used with, and use it while they live.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

namespace CLI {
class App;
}

namespace clustr {

// What a resumed run may do with a setting.
enum class Resume {
  locked,  // the model's shape, attention, task, optimizer kind: a resume keeps the checkpoint's
  noted,   // the training trajectory (lr, batch, seed, ...): may change, with a note
  free,    // the rest (output, logging, threads, device): not compared
};

class FlagTable {
 public:
  struct Entry {
    std::string name, help;
    Resume resume = Resume::free;
    bool stored = true;        // in the configuration table and checkpoints
    std::string when_absent;   // a checkpoint without the key: this value ("": an error)
    std::function<std::string()> get;                    // the value as text
    std::function<void(const std::string&)> set;         // from text; throws when malformed
    std::function<void(CLI::App&, const Entry&)> add;    // the CLI11 option
    std::vector<std::function<void()>> checks;           // each throws on a bad value
  };

  // A setting bound to `field` (int, int64_t, uint64_t, float, double, bool as a flag without
  // a value, std::string). Returns the table, whose modifiers below apply to this entry.
  FlagTable& add(const std::string& name, int& field, const std::string& help);
  FlagTable& add(const std::string& name, int64_t& field, const std::string& help);
  FlagTable& add(const std::string& name, uint64_t& field, const std::string& help);
  FlagTable& add(const std::string& name, float& field, const std::string& help);
  FlagTable& add(const std::string& name, double& field, const std::string& help);
  FlagTable& add(const std::string& name, bool& field, const std::string& help);
  FlagTable& add(const std::string& name, std::string& field, const std::string& help);
  // A setting of another type, read and written as text by `parse` and `print`.
  FlagTable& add_text(const std::string& name, std::function<std::string()> print,
                      std::function<void(const std::string&)> parse, const std::string& help);

  // Checks of the last entry's value, with the flag's name in the message.
  FlagTable& at_least(double lo);                 // "--x must be >= lo, got v"
  FlagTable& within(double lo, double hi);        // "--x must be in [lo, hi], got v"
  FlagTable& one_of(const std::vector<std::string>& values);  // "--x must be a, b or c, got 'v'"
  // A check of its own: `ok` false throws "--x " + `expected` + ", got v" (without the value
  // when show_value is false).
  FlagTable& check(std::function<bool()> ok, const std::string& expected,
                   bool show_value = true);
  FlagTable& resume(Resume r);
  FlagTable& not_stored();  // a run-time choice (--overwrite): not in config or checkpoints
  FlagTable& when_absent(const std::string& value);  // for checkpoints older than the setting

  // The flags, in declaration order, except those named in `skip`.
  void add_to(CLI::App& app, const std::set<std::string>& skip = {}) const;
  // Runs every check; throws clustr::Error naming the first bad flag.
  void validate() const;
  // (name, value) of the stored settings, in declaration order.
  std::vector<std::pair<std::string, std::string>> entries() const;
  std::map<std::string, std::string> config() const;
  // Sets the settings named in `keys` from a config map (a checkpoint's); throws naming a
  // missing key (unless it has a when_absent value) or a malformed value.
  void apply(const std::map<std::string, std::string>& config,
             const std::vector<std::string>& keys);
  // Sets settings from "name=value name=value ..." (values as on the command line, without
  // spaces): a preset's.
  void set(const std::string& assignments);
  // The names of the settings with this resume rule, in declaration order.
  std::vector<std::string> keys(Resume r) const;
  bool has(const std::string& name) const;

 private:
  Entry& last();
  const Entry* find(const std::string& name) const;
  FlagTable& push(Entry e);
  std::vector<Entry> entries_;
};

// "--key: checkpoint <a>, now <b>" for each of `keys` whose value differs between a
// checkpoint's config and the current one ("(absent)" for a missing key).
std::vector<std::string> config_differences(const std::map<std::string, std::string>& saved,
                                            const std::map<std::string, std::string>& now,
                                            const std::vector<std::string>& keys);

// The shortest decimal that reads back as exactly v (configs round-trip and read well:
// "0.2", not "0.200000003").
std::string exact_text(float v);
std::string exact_text(double v);

}  // namespace clustr
