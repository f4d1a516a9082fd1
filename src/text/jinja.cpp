#include "text/jinja.h"

#include "text/jinja_parser.h"
#include "text/jinja_runtime.h"

namespace ferry::text::jinja {

std::tm local_now() {
  std::time_t t = std::time(nullptr);
  std::tm out{};
  localtime_r(&t, &out);
  return out;
}

Template::Template(std::string_view source, const LexOptions& lex, std::string op)
    : program_(parse(source, lex, op)) {}

std::string Template::render(const Value& context, const RenderOptions& options) const {
  if (!context.is_mapping())
    throw Error("[" + program_->op + "] the render context must be a dict");
  Runtime rt(*program_, options, context);
  return rt.render();
}

}  // namespace ferry::text::jinja
