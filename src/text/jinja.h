// A small Jinja interpreter for chat templates: the subset of Jinja2 that
// Hugging Face chat templates use, with the environment transformers renders
// them in (ImmutableSandboxedEnvironment(trim_blocks=True,
// lstrip_blocks=True) plus loopcontrols, {% generation %}, and the globals
// raise_exception, strftime_now, namespace and dict; `tojson` is
// json.dumps(ensure_ascii=False) as transformers overrides it).
//
// Anything outside the subset fails loudly instead of rendering something
// else: unknown statements, filters and tests at parse time, unsupported
// methods and operations at render time, each with line:col.
//
//   jinja::Template t("{{ greeting | upper }}, {{ name }}!");
//   auto ctx = std::make_shared<jinja::DictData>();
//   ctx->set("greeting", "hello");
//   ctx->set("name", "ferry");
//   t.render(jinja::Value::dict(ctx));  // "HELLO, ferry!"
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "text/jinja_json.h"
#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace ferry::text::jinja {

// Local wall-clock time for strftime_now(); tests inject a fixed one.
using Clock = std::function<std::tm()>;
std::tm local_now();

struct RenderOptions {
  // Caps the output and every intermediate string (bytes).
  std::size_t max_output_bytes = std::size_t{16} << 20;
  // Caps lists built by range() and list repetition.
  std::size_t max_list_items = std::size_t{1} << 20;
  // Macro calls nested deeper than this fail (runaway recursion).
  int max_call_depth = 64;
  // Expression evaluations, loop iterations and calls per render.
  std::uint64_t max_steps = 50'000'000;
  Clock clock;  // empty: local_now
};

struct Program;

class Template {
 public:
  // Parses now. Errors throw ferry::Error("[op] line:col: ..."), `op` being
  // the bracketed prefix of every message this template produces.
  explicit Template(std::string_view source, const LexOptions& lex = {}, std::string op = "jinja");

  // context: a dict whose entries are the template's variables; they shadow
  // the builtin globals. Throws ferry::Error("[op] line:col: ...") on render
  // errors and TemplateException for raise_exception().
  std::string render(const Value& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace ferry::text::jinja
