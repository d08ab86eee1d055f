#include "command_line.h"

#include <cctype>
#include <charconv>

#include "tessel/core/suggest.h"

namespace tessel::cli {
namespace {

bool is_flag(const std::string& s) {
  if (s.size() < 2 || s[0] != '-') return false;
  double x;
  return std::from_chars(s.data(), s.data() + s.size(), x).ec != std::errc();  // not "-1"
}

const CLI::App* subcommand(const CLI::App& app, const std::string& name) {
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    if (sub->get_name() == name) return sub;
  return nullptr;
}

std::vector<std::string> subcommand_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    out.push_back(sub->get_name());
  return out;
}

std::vector<std::string> flag_names(const CLI::App& app) {
  std::vector<std::string> out;
  for (const CLI::Option* o : app.get_options()) {
    for (const std::string& l : o->get_lnames()) out.push_back("--" + l);
    for (const std::string& s : o->get_snames()) out.push_back("-" + s);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const std::string& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

std::string unknown(const std::string& command, const char* what, const std::string& got,
                    const std::vector<std::string>& valid) {
  const std::string near = nearest(got, valid);
  return std::string("unknown ") + what + " '" + got + "'" +
         (near.empty() ? "" : "; did you mean '" + near + "'?") + " (`" + command +
         " --help` lists them)";
}

// "--workers: ranks as threads of this process (runtime.workers); see `tessel train --help`"
std::string what_it_is(const std::string& command, const CLI::Option& opt) {
  std::string d = opt.get_description();
  if (!d.empty()) d[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(d[0])));
  return "it takes " + d + " (`" + command + " --help`)";
}

// Checks a flag's value against the type CLI11 converts it to.
std::string bad_value(const std::string& command, const CLI::Option& opt, const std::string& flag,
                      const std::string& value) {
  const std::string type = opt.get_type_name();
  if (type.rfind("INT", 0) != 0 && type.rfind("UINT", 0) != 0) return "";
  int64_t x;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), x);
  if (ec == std::errc() && end == value.data() + value.size()) return "";
  return flag + " expects a whole number, got '" + value + "'; " + what_it_is(command, opt);
}

}  // namespace

std::vector<std::string> arguments(int argc, char** argv) {
  std::vector<std::string> out(argv + 1, argv + argc);
  for (std::string& a : out)
    if (a == "-np") a = "--np";
  return out;
}

Walk walk(const CLI::App& app, const std::vector<std::string>& args) {
  Walk w{"tessel", ""};
  const CLI::App* cur = &app;
  bool help = false;  // --help or --version: CLI11 answers whatever else is missing
  for (size_t i = 0; i < args.size() && w.error.empty(); ++i) {
    const std::string& a = args[i];
    if (a == "--") break;  // the rest are positional
    if (!is_flag(a)) {
      if (const CLI::App* sub = subcommand(*cur, a)) {
        cur = sub;
        w.command += " " + a;
        if (sub->get_prefix_command()) return w;  // it parses its arguments itself (launch)
      } else if (cur->get_require_subcommand_min() > 0) {
        w.error = unknown(w.command, "command", a, subcommand_names(*cur));
      }
      continue;  // a positional argument
    }
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    const CLI::Option* opt = cur->get_option_no_throw(flag);
    if (opt == nullptr) {
      w.error = unknown(w.command, "flag", flag, flag_names(*cur));
      continue;
    }
    if (opt->get_items_expected_min() == 0) {  // a switch
      help = help || opt == cur->get_help_ptr() || flag == "--version";
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < args.size() && !is_flag(args[i + 1])) {
      value = args[++i];
    } else {
      w.error = flag + " needs a value; " + what_it_is(w.command, *opt);
      continue;
    }
    w.error = bad_value(w.command, *opt, flag, value);
  }
  if (w.error.empty() && !help && cur->get_require_subcommand_min() > 0)
    w.error = "which command? one of " + join(subcommand_names(*cur)) + " (`" + w.command +
              " --help` says what each does)";
  return w;
}

std::string explain(const Walk& walk, const CLI::ParseError& e) {
  return std::string(e.what()) + " (`" + walk.command + " --help` lists the arguments)";
}

CLI::Validator at_least(int64_t min, const std::string& what) {
  return CLI::Validator(
      [min, what](std::string& s) -> std::string {
        int64_t x = 0;
        const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), x);
        if (ec != std::errc() || end != s.data() + s.size() || x < min)
          return "must be at least " + std::to_string(min) + " (" + what + "), got " + s;
        return "";
      },
      "");
}

}  // namespace tessel::cli
