// The chat page served at GET /: one self-contained HTML file with inline
// CSS and JavaScript (no build step, no external assets) that streams a
// conversation from /v1/chat/completions.
//
// Test hook: /?q=TEXT sends TEXT as soon as the page loads (optional
// &max_tokens=N, &temperature=T); when the answer has streamed,
// <body data-state="done"> and the answer is in #log (see docs/SERVER.md).
#pragma once

#include <string_view>

namespace ferry::server {

std::string_view chat_page_html();

}  // namespace ferry::server
