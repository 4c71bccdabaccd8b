#include "daemon/base/command_line.h"

#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/base/closest_word.h"

namespace ckptd {
namespace {

// What went wrong, for the first word that is neither a subcommand (in first place)
// nor a flag of the subcommand given, with the closest known one; else CLI11's own
// message. *sub: the subcommand named, if any.
std::string Problem(CLI::App& app, int argc, char** argv, const std::string& what, CLI::App** named) {
  std::vector<std::string> subcommands;
  for (const CLI::App* sub : app.get_subcommands({})) subcommands.push_back(sub->get_name());
  CLI::App* sub = &app;  // without subcommands, the flags are the app's own
  int first_flag = 1;
  *named = nullptr;
  if (!subcommands.empty()) {
    const std::string one_of = absl::StrCat("; one of: ", absl::StrJoin(subcommands, ", "));
    if (argc < 2) return absl::StrCat(what, one_of);
    first_flag = 2;
    sub = nullptr;
    for (CLI::App* s : app.get_subcommands({})) {
      if (s->get_name() == argv[1]) sub = s;
    }
    const std::string first = argv[1];
    if (sub == nullptr) {
      if (first.rfind("-", 0) == 0) return what;
      std::optional<std::string> near = ClosestWord(first, subcommands);
      return absl::StrCat("unknown command '", first, "'",
                          near.has_value() ? absl::StrCat(" (did you mean '", *near, "'?)") : one_of);
    }
    *named = sub;
  }
  std::vector<std::string> flags;
  for (const CLI::Option* option : sub->get_options()) {
    for (const std::string& name : option->get_lnames()) flags.push_back("--" + name);
  }
  for (int i = first_flag; i < argc; ++i) {
    std::string word = argv[i];
    if (word.rfind("--", 0) != 0) continue;
    word = word.substr(0, word.find('='));
    if (std::find(flags.begin(), flags.end(), word) != flags.end()) continue;
    std::optional<std::string> near = ClosestWord(word, flags);
    return absl::StrCat("unknown flag '", word, "'",
                        near.has_value() ? absl::StrCat(" (did you mean '", *near, "'?)") : "");
  }
  return what;
}

}  // namespace

std::optional<int> ParseCommandLine(CLI::App& app, int argc, char** argv, absl::string_view program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    CLI::App* named = nullptr;
    const std::string problem = Problem(app, argc, argv, e.what(), &named);
    std::cerr << program << ": " << problem << "\nRun '" << program << " "
              << (named != nullptr ? named->get_name() + " " : "") << "--help' for usage." << std::endl;
    return kUsageError;
  }
  return std::nullopt;
}

CLI::Validator IntegerAtLeast(int64_t min) {
  return CLI::Validator(
      [min](std::string& text) -> std::string {
        int64_t value = 0;
        if (absl::SimpleAtoi(text, &value) && value >= min) return "";
        return absl::StrCat("must be an integer ", min, " or more, not '", text, "'");
      },
      absl::StrCat("INT >= ", min));
}

CLI::Validator NumberAtLeastZero() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double value = 0;
        if (absl::SimpleAtod(text, &value) && value >= 0) return "";
        return absl::StrCat("must be a number 0 or more, not '", text, "'");
      },
      "NUMBER >= 0");
}

}  // namespace ckptd
