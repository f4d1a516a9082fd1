// Unit tests of the Jinja interpreter, construct by construct. The table
// cases were checked against jinja2 3.1.6 in transformers' environment
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, their tojson).
#include "text/jinja.h"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

namespace ferry::text::jinja {
namespace {

std::string render(std::string_view tmpl, std::string_view ctx = "{}",
                   const RenderOptions& opt = {}) {
  Template t(tmpl);
  return t.render(from_json(nlohmann::ordered_json::parse(ctx)), opt);
}

// The message of the ferry::Error that parsing or rendering throws.
std::string error_of(std::string_view tmpl, std::string_view ctx = "{}",
                     const RenderOptions& opt = {}) {
  try {
    render(tmpl, ctx, opt);
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

struct Case {
  const char* tmpl;
  const char* ctx;
  const char* expected;
};

void run_cases(const std::vector<Case>& cases) {
  for (const Case& c : cases) {
    SCOPED_TRACE(c.tmpl);
    try {
      EXPECT_EQ(render(c.tmpl, c.ctx), c.expected);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "threw: " << e.what();
    }
  }
}

TEST(JinjaLexer, WhitespaceControl) {
  run_cases({
      {R"J(plain text)J", R"J({})J", R"J(plain text)J"},
      {R"J(a  {%- if true -%}  b  {%- endif -%}  c)J", R"J({})J", R"J(abc)J"},
      {R"J(a {{- 'x' -}} b)J", R"J({})J", R"J(axb)J"},
      {"line\n", R"J({})J", R"J(line)J"},
      {"line\n\n", R"J({})J", "line\n"},
      {"a\r\nb\rc", R"J({})J", "a\nb\nc"},
      {"{% if true %}\nx\n{% endif %}\ny", R"J({})J", "x\ny"},
      {"  {% if true %}\n  x\n  {% endif %}\n  y", R"J({})J", "  x\n  y"},
      {"   {{ 'x' }}\n   {% if 1 %}y{% endif %}", R"J({})J", "   x\ny"},
      {"{%+ if true %}x{% endif +%}\ny", R"J({})J", "x\ny"},
      {"  {%+ if true %}x{% endif %}", R"J({})J", "  x"},
      {"{{ 'a' }}\n{% if 1 %}\nb\n{% endif %}\n", R"J({})J", "a\nb\n"},
      {"{# c #}\n{{ 1 }}\n{#- c -#}\n2", R"J({})J", "12"},
      {"x {# comment {{ not }} #} y", R"J({})J", "x  y"},
      {"a {#-", R"J({})J", "a"},
      {"a{#\n", R"J({})J", "a"},
      {"  {# c #}\nz", R"J({})J", "z"},
      {"{% raw %}{{ not rendered }}{% endraw %}", R"J({})J", "{{ not rendered }}"},
      {"a {%- raw %} {{ x }} {% endraw -%} b", R"J({})J", "a {{ x }} b"},
      {"{{ '}}' }}", R"J({})J", "}}"},
      {"{{ {'a': {'b': 1}}['a'] }}", R"J({})J", "{'b': 1}"},
  });
}

TEST(JinjaLexer, Literals) {
  run_cases({
      {R"J({{ 'it\'s' }}|{{ "say \"hi\"" }}|{{ 'tab\there' }}|{{ 'a\\b' }})J", R"J({})J",
       "it's|say \"hi\"|tab\there|a\\b"},
      {R"J({{ 'nl\nx' }}|{{ '\x41\u00e9\U0001F680' }}|{{ '\d' }})J", R"J({})J", "nl\nx|Aé🚀|\\d"},
      {R"J({{ 'a' 'b' "c" }})J", R"J({})J", R"J(abc)J"},
      {R"J({{ 42 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }})J", R"J({})J",
       R"J(42 1000 31 15 5)J"},
      {R"J({{ 1.5 }} {{ 1e3 }} {{ 2.5e-3 }} {{ 10.0 }})J", R"J({})J",
       R"J(1.5 1000.0 0.0025 10.0)J"},
      {R"J({{ true }} {{ True }} {{ false }} {{ none }} {{ None }})J", R"J({})J",
       R"J(True True False None None)J"},
      {R"J({{ [1, 'a', none, true, 1.0] }})J", R"J({})J", R"J([1, 'a', None, True, 1.0])J"},
      {R"J({{ (1,) }} {{ () }} {{ (1, 'b') }} {{ 1, 2 }})J", R"J({})J",
       R"J((1,) () (1, 'b') (1, 2))J"},
      {R"J({{ {'k': 'v', 'n': [1]} }})J", R"J({})J", R"J({'k': 'v', 'n': [1]})J"},
      {R"J({{ ["it's", 'say "x"', 'both \' "'] }})J", R"J({})J",
       R"J(["it's", 'say "x"', 'both \' "'])J"},
      {R"J({{ [1, 2,] }}{{ {'a': 1,} }})J", R"J({})J", R"J([1, 2]{'a': 1})J"},
      {R"J({{ ['a\u200bb', '\xa0\x85\x7f', '\U000F0000', 'é🚀'] }})J", R"J({})J",
       R"J(['a\u200bb', '\xa0\x85\x7f', '\U000f0000', 'é🚀'])J"},
  });
}

TEST(JinjaExpr, Arithmetic) {
  run_cases({
      {R"J({{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 10 }} {{ 2 ** 3 ** 2 }} {{ 2 ** -1 }})J",
       R"J({})J", R"J(7 9 1024 64 0.5)J"},
      {R"J({{ 10 / 4 }} {{ 10 / 5 }} {{ 7 // 2 }} {{ 7 // -2 }} {{ 7 % -2 }} {{ -7 % 3 }})J",
       R"J({})J", R"J(2.5 2.0 3 -4 -1 2)J"},
      {R"J({{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 / 3 }} {{ 0.1 + 0.2 }})J", R"J({})J",
       R"J(3.0 0.5 0.3333333333333333 0.30000000000000004)J"},
      {R"J({{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123456789012345678.0 }} {{ -0.0 }})J",
       R"J({})J", R"J(1e+16 1000000000000000.0 0.0001 1e-05 1.2345678901234568e+17 -0.0)J"},
      {R"J({{ -x }} {{ +x }} {{ true + 1 }} {{ - 3 }} {{ -(2) }})J", R"J({"x": true})J",
       R"J(-1 1 2 -3 -2)J"},
      {R"J({{ 'ab' * 2 }}{{ 2 * 'c' }}{{ [1] * 3 }}{{ 'x' * -1 }})J", R"J({})J",
       R"J(ababcc[1, 1, 1])J"},
      {R"J({{ 'a' + 'b' }} {{ [1] + [2] }} {{ (1,) + (2,) }})J", R"J({})J",
       R"J(ab [1, 2] (1, 2))J"},
      {R"J({{ 'a' ~ 1 ~ none ~ x ~ true ~ 1.0 }})J", R"J({})J", R"J(a1NoneTrue1.0)J"},
      {R"J({{ (1 + 2) ~ 3 }} {{ 'n=' ~ 2 * 3 }} {{ 1 ~ 2 * 3 }})J", R"J({})J", R"J(33 n=6 16)J"},
  });
}

TEST(JinjaExpr, LogicAndComparison) {
  run_cases({
      {R"J({{ 1 == 1.0 }} {{ [1] == (1,) }} {{ 'a' != 'b' }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }})J",
       R"J({})J", R"J(True False True True False)J"},
      {R"J({{ 'abc' < 'abd' }} {{ [1, 2] < [1, 3] }} {{ 2 >= 2.0 }} {{ none == none }})J",
       R"J({})J", R"J(True True True True)J"},
      {R"J({{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ not 0 }})J",
       R"J({})J", R"J(x b  [] True)J"},
      {R"J({{ 'b' in 'abc' }} {{ 1 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 1 in u }})J",
       R"J({})J", R"J(True True True True False)J"},
      {R"J({{ not x is defined }} {{ not (1 == 1) }} {{ not 1 == 2 }})J", R"J({})J",
       R"J(True False True)J"},
      {R"J({{ 'y' if x else 'n' }} {{ 'y' if not x else 'n' }} [{{ 'y' if x }}])J", R"J({})J",
       R"J(n y [])J"},
      {R"J({{ 1 if a else 2 if b else 3 }})J", R"J({"a": false, "b": true})J", R"J(2)J"},
      {R"J({{ x == y }} {{ x != 1 }})J", R"J({})J", R"J(True True)J"},
  });
}

TEST(JinjaExpr, AccessAndUndefined) {
  run_cases({
      {R"J({{ m.role }} {{ m['role'] }} {{ l.0 }} {{ l[-1] }} {{ l[5] }}|{{ m.missing }}|{{ m['missing'] }})J",
       R"J({"m": {"role": "user"}, "l": [1, 2, 3]})J", R"J(user user 1 3 ||)J"},
      {R"J({{ 'abc'[0] }}{{ 'héllo'[1] }}{{ 'abc'[-1] }}[{{ 'abc'[9] }}])J", R"J({})J",
       R"J(aéc[])J"},
      {R"J({{ l[1:] }} {{ l[:-1] }} {{ l[::-1] }} {{ l[::2] }} {{ 'héllo'[1:3] }} {{ 'abc'[::-1] }})J",
       R"J({"l": [1, 2, 3]})J", R"J([2, 3] [1, 2] [3, 2, 1] [1, 3] él cba)J"},
      {R"J({{ l[5:] }} {{ l[-9:1] }} {{ l[1:2:0 + 1] }})J", R"J({"l": [1, 2, 3]})J",
       R"J([] [1] [2])J"},
      {R"J([{{ x }}] [{{ x | default('d') }}] [{{ none.y }}] [{{ 'abc'.foo }}] [{{ 5.foo }}])J",
       R"J({})J", R"J([] [d] [] [] [])J"},
      {R"J({% for x in undefined_list %}{{ x }}{% endfor %}{{ undefined_list | length }})J",
       R"J({})J", R"J(0)J"},
  });
}

TEST(JinjaStatements, IfForSet) {
  run_cases({
      {R"J({% if a %}A{% elif b %}B{% else %}C{% endif %})J", R"J({"b": 1})J", R"J(B)J"},
      {R"J({% if a %}A{% elif b %}B{% else %}C{% endif %})J", R"J({})J", R"J(C)J"},
      {R"J({% for x in [1, 2, 3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %})J",
       R"J({})J", R"J(1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;)J"},
      {R"J({% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}|{% endfor %})J",
       R"J({})J", R"J(-2|1-3|2-|)J"},
      {R"J({% for x in [1, 2, 3, 4] if x is even %}{{ x }}/{{ loop.length }}{% endfor %})J",
       R"J({})J", R"J(2/24/2)J"},
      {R"J({% for x in [] %}no{% else %}empty{% endfor %})J", R"J({})J", R"J(empty)J"},
      {R"J({% for x in [1] if false %}no{% else %}filtered{% endfor %})J", R"J({})J",
       R"J(filtered)J"},
      {R"J({% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %})J",
       R"J({"d": {"x": 1, "y": 2}})J", R"J(x=1;y=2;xy)J"},
      {R"J({% for a, b in [[1, 2], (3, 4)] %}{{ a + b }}{% endfor %})J", R"J({})J", R"J(37)J"},
      {R"J({% for c in 'héj' %}[{{ c }}]{% endfor %})J", R"J({})J", R"J([h][é][j])J"},
      {R"J({% for i in range(5) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %})J",
       R"J({})J", R"J(02)J"},
      {R"J({% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{% endfor %})J",
       R"J({})J", R"J(11x 21y 12x 22y )J"},
      {R"J({% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %})J", R"J({})J",
       R"J(aba)J"},
      {R"J({% for x in [1, 1, 2] %}{{ loop.changed(x) }}{% endfor %})J", R"J({})J",
       R"J(TrueFalseTrue)J"},
      {R"J({% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }})J",
       R"J({})J", R"J(110;120;1)J"},
      {R"J({% for i in [1, 2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %})J",
       R"J({})J", R"J([])J"},
      {R"J({% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }})J", R"J({})J", R"J(2)J"},
      {R"J({% set a, b = 1, 2 %}{{ a }}{{ b }}{% set (c, d) = 'xy' %}{{ c }}{{ d }})J", R"J({})J",
       R"J(12xy)J"},
      {R"J({% set messages = messages[1:] %}{{ messages | length }})J",
       R"J({"messages": [1, 2, 3]})J", R"J(2)J"},
      {R"J({% set ns = namespace(found=false, n=0) %}{% for x in [1, 2, 3] %}{% if x == 2 %}{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.found }} {{ ns.n }} [{{ ns.missing }}])J",
       R"J({})J", R"J(True 6 [])J"},
      {R"J({% set ns = namespace({'a': 1}, b=2) %}{{ ns.a }}{{ ns['b'] }})J", R"J({})J", R"J(12)J"},
      {R"J({% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}])J", R"J({})J",
       R"J([inner 2])J"},
      {R"J({% generation %}{{ 'tracked' }}{% endgeneration %})J", R"J({})J", R"J(tracked)J"},
  });
}

TEST(JinjaStatements, Macros) {
  run_cases({
      {R"J({% macro f(a, b='d') %}[{{ a }}|{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, 2) }}{{ f(b=3, a=4) }})J",
       R"J({})J", R"J([1|d][1|2][4|3])J"},
      {R"J({% macro f(a) %}{{ a }}{{ y }}{% endmacro %}{% set y = 5 %}{{ f(1) }}{% set y = 6 %}{{ f(2) }})J",
       R"J({})J", R"J(1526)J"},
      {R"J({% macro f(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ f('x') }})J", R"J({})J", R"J(x!)J"},
      {R"J({% macro f(a) %}[{{ a }}]{% endmacro %}{{ f() }})J", R"J({})J", R"J([])J"},
      {R"J({% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1) | int }}{% endif %}{% endmacro %}{{ fact(5) }})J",
       R"J({})J", R"J(120)J"},
      {R"J({% macro m() %}X{% endmacro %}{{ m() + 'y' }} {{ m() | length }})J", R"J({})J",
       R"J(Xy 1)J"},
  });
}

TEST(JinjaFilters, Strings) {
  run_cases({
      {R"J({{ '  x  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ ' a ' | trim | upper }})J", R"J({})J",
       R"J(x|hi|A)J"},
      {R"J({{ 'aBc' | upper }} {{ 'aBc' | lower }} {{ 'hello wORLD' | capitalize }})J", R"J({})J",
       R"J(ABC abc Hello world)J"},
      {R"J({{ 'hello-world (x) [y] {z} <w>' | title }} {{ "they're" | title }})J", R"J({})J",
       R"J(Hello-World (X) [Y] {Z} <W> They're)J"},
      {R"J({{ 'ß straße' | upper }} {{ 'ΣΑΣ ΟΔΟΣ' | lower }} {{ 'ÉCOLE Ñandú' | lower }} {{ 'привет' | upper }})J",
       R"J({})J", R"J(SS STRASSE σας οδος école ñandú ПРИВЕТ)J"},
      {R"J({{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} {{ 'ab' | replace('', '-') }})J",
       R"J({})J", R"J(bbb bba -a-b-)J"},
      {R"J({{ 'a\nb\n' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(2, blank=true) }}|{{ 'a\nb' | indent('> ') }})J",
       R"J({})J", "a\n  b\n|  a\n  b|a\n  \n  b|a\n> b"},
      {R"J({{ 1 | string }}{{ none | string }}{{ [1] | string }}{{ x | string }})J", R"J({})J",
       R"J(1None[1])J"},
      {R"J({{ '<a href="x">&' | e }} {{ '<b>' | escape | escape }} {{ ('<i>' | safe) + '<' }} {{ '<' + ('<i>' | safe) }})J",
       R"J({})J", R"J(&lt;a href=&#34;x&#34;&gt;&amp; &lt;b&gt; <i>&lt; &lt;<i>)J"},
      {R"J({{ 'abc' | reverse }} {{ 'abc' | list }} {{ 'héllo' | length }} {{ 'abc' | first }}{{ 'abc' | last }})J",
       R"J({})J", R"J(cba ['a', 'b', 'c'] 5 ac)J"},
  });
}

TEST(JinjaFilters, Sequences) {
  run_cases({
      {R"J({{ [1, 2] | first }}{{ [] | first }}{{ [1, 2] | last }}{{ {'a': 1} | first }}{{ x | first }})J",
       R"J({})J", R"J(12a)J"},
      {R"J({{ [1, 'a'] | join('-') }}|{{ [1, 2] | join }}|{{ users | join(', ', attribute='name') }})J",
       R"J({"users": [{"name": "ann"}, {"name": "bob"}]})J", R"J(1-a|12|ann, bob)J"},
      {R"J({{ [3, 1, 2] | sort }} {{ ['b', 'A', 'c'] | sort }} {{ ['b', 'A', 'c'] | sort(case_sensitive=true) }} {{ [1, 3, 2] | sort(reverse=true) }})J",
       R"J({})J", R"J([1, 2, 3] ['A', 'b', 'c'] ['A', 'b', 'c'] [3, 2, 1])J"},
      {R"J({{ users | sort(attribute='age') | map(attribute='name') | join(',') }})J",
       R"J({"users": [{"name": "a", "age": 30}, {"name": "b", "age": 20}]})J", R"J(b,a)J"},
      {R"J({{ [1, 2] | reverse | list }} {{ {'a': 1, 'b': 2} | reverse | list }} {{ [1, 2, 2, 'A', 'a'] | unique | list }})J",
       R"J({})J", R"J([2, 1] ['b', 'a'] [1, 2, 'A'])J"},
      {R"J({{ [3, 1, 2] | min }} {{ [3, 1, 2] | max }} {{ ['b', 'A'] | min }} {{ [] | max }} {{ users | max(attribute='age') }})J",
       R"J({"users": [{"age": 1}, {"age": 5}]})J", R"J(1 3 A  {'age': 5})J"},
      {R"J({{ [1, 2, 3] | sum }} {{ [0.5, 1] | sum }} {{ users | sum(attribute='age', start=10) }})J",
       R"J({"users": [{"age": 1}, {"age": 5}]})J", R"J(6 1.5 16)J"},
      {R"J({{ [1, 2, 3] | length }} {{ {'a': 1} | count }} {{ 'ab' | length }})J", R"J({})J",
       R"J(3 1 2)J"},
      {R"J({{ d | items | list }} {{ d | dictsort }} {{ d | dictsort(by='value', reverse=true) }})J",
       R"J({"d": {"b": 1, "a": 2}})J",
       R"J([('b', 1), ('a', 2)] [('a', 2), ('b', 1)] [('a', 2), ('b', 1)])J"},
      {R"J({{ range(3) | list }} {{ range(1, 10, 3) | list }} {{ range(3, 0, -1) | list }} {{ range(0) | list }})J",
       R"J({})J", R"J([0, 1, 2] [1, 4, 7] [3, 2, 1] [])J"},
  });
}

TEST(JinjaFilters, SelectMapDefault) {
  const char* msgs =
      R"J({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "a"},
                          {"role": "user", "content": "b", "extra": 1}]})J";
  run_cases({
      {R"J({{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }})J",
       msgs, R"J(a,b)J"},
      {R"J({{ messages | rejectattr('role', 'eq', 'user') | list | length }})J", msgs, R"J(1)J"},
      {R"J({{ messages | selectattr('extra') | map(attribute='content') | list }})J", msgs,
       R"J(['b'])J"},
      {R"J({{ messages | selectattr('extra', 'defined') | list | length }})J", msgs, R"J(1)J"},
      {R"J({{ messages | map(attribute='extra', default=0) | list }})J", msgs, R"J([0, 0, 1])J"},
      {R"J({{ [1, 2, 3, 4] | select('odd') | list }} {{ [1, 2, 3, 4] | reject('odd') | list }} {{ [0, 1, ''] | select | list }})J",
       R"J({})J", R"J([1, 3] [2, 4] [1])J"},
      {R"J({{ ['a', 'b'] | map('upper') | join }} {{ [1, 2] | map('string') | list }} {{ ['x'] | map('replace', 'x', 'y') | list }})J",
       R"J({})J", R"J(AB ['1', '2'] ['y'])J"},
      {R"J({{ [[1, 'x'], [2, 'y']] | map(attribute='1') | join }} {{ [{'a': {'b': 7}}] | map(attribute='a.b') | list }})J",
       R"J({})J", R"J(xy [7])J"},
      {R"J({% if messages | selectattr('role', 'equalto', 'tool') %}always{% endif %})J", msgs,
       R"J(always)J"},
      {R"J({% set g = [1, 2, 3] | select %}{{ g | first }}{{ g | list }}{{ g | list }})J",
       R"J({})J", R"J(1[2, 3][])J"},
      {R"J({{ x | default('d') }} {{ none | default('d') }} {{ '' | default('d') }} {{ '' | default('d', true) }} {{ 0 | d(5, boolean=true) }})J",
       R"J({})J", R"J(d None  d 5)J"},
  });
}

TEST(JinjaFilters, Numbers) {
  run_cases({
      {R"J({{ 3.0 | int }} {{ '42.5' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ '0x1A' | int(base=16) }} {{ ' 12 ' | int }} {{ true | int }} {{ none | int }})J",
       R"J({})J", R"J(3 42 0 7 26 12 1 0)J"},
      {R"J({{ '1.5' | float }} {{ 2 | float }} {{ 'x' | float }} {{ 'inf' | float }})J", R"J({})J",
       R"J(1.5 2.0 0.0 inf)J"},
      {R"J({{ 2.5 | round }} {{ 3.5 | round }} {{ 3 | round }} {{ 2.675 | round(2) }} {{ 3.14159 | round(2, 'floor') }} {{ 3.1 | round(0, 'ceil') }})J",
       R"J({})J", R"J(2.0 4.0 3 2.67 3.14 4.0)J"},
      {R"J({{ -3 | abs }} {{ -2.5 | abs }} {{ (-3) | abs }})J", R"J({})J", R"J(3 2.5 3)J"},
  });
}

TEST(JinjaFilters, ToJson) {
  run_cases({
      {R"J({{ d | tojson }})J", R"J({"d": {"b": 1, "a": [1, 2.0, null, true, "é\"\n<&>"]}})J",
       R"J({"b": 1, "a": [1, 2.0, null, true, "é\"\n<&>"]})J"},
      {R"J({{ d | tojson(indent=2) }})J", R"J({"d": {"b": 1, "a": [], "c": {}}})J",
       "{\n  \"b\": 1,\n  \"a\": [],\n  \"c\": {}\n}"},
      {R"J({{ [1, {'b': 1, 'a': {}}] | tojson(indent=2, sort_keys=true) }})J", R"J({})J",
       "[\n  1,\n  {\n    \"a\": {},\n    \"b\": 1\n  }\n]"},
      {R"J({{ 'é🚀\u0001' | tojson(ensure_ascii=true) }} {{ 'é' | tojson }})J", R"J({})J",
       R"J("\u00e9\ud83d\ude80\u0001" "é")J"},
      {R"J({{ {'a': 1, 'b': [2]} | tojson(separators=(',', ':')) }} {{ [1] | tojson(indent=0) }})J",
       R"J({})J", "{\"a\":1,\"b\":[2]} [\n1\n]"},
      {R"J({{ 'text' | tojson }} {{ 1.5 | tojson }} {{ none | tojson }} {{ (1, 2) | tojson }})J",
       R"J({})J", R"J("text" 1.5 null [1, 2])J"},
  });
}

TEST(JinjaTests, Builtins) {
  run_cases({
      {R"J({{ x is defined }}{{ x is undefined }}{{ none is none }}{{ 1 is none }}{{ 'a' is string }}{{ 1 is string }})J",
       R"J({})J", R"J(FalseTrueTrueFalseTrueFalse)J"},
      {R"J({{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ true is integer }}{{ 1 is integer }}{{ 1.0 is float }})J",
       R"J({})J", R"J(TrueTrueTrueFalseTrueTrue)J"},
      {R"J({{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ x is iterable }})J",
       R"J({})J", R"J(TrueFalseTrueTrueFalseTrue)J"},
      {R"J({{ true is true }}{{ 1 is true }}{{ false is false }}{{ true is boolean }}{{ 0 is boolean }})J",
       R"J({})J", R"J(TrueFalseTrueTrueFalse)J"},
      {R"J({{ 1 is odd }}{{ 2 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }})J",
       R"J({})J", R"J(TrueTrueTrueFalse)J"},
      {R"J({{ 'a' is equalto 'a' }}{{ 1 is eq 2 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 2 is ge 2 }}{{ 3 is gt 2 }}{{ 2 is le 1 }})J",
       R"J({})J", R"J(TrueFalseTrueTrueTrueTrueFalse)J"},
      {R"J({{ 'b' is in 'abc' }}{{ 1 is in [2] }}{{ x is not defined }}{{ 'a' is not string }})J",
       R"J({})J", R"J(TrueFalseTrueFalse)J"},
      {R"J({{ none is sameas none }}{{ false is sameas false }}{{ l is sameas l }}{{ [] is sameas [] }})J",
       R"J({"l": [1]})J", R"J(TrueTrueTrueFalse)J"},
      {R"J({{ 'abc' is lower }}{{ 'aBc' is lower }}{{ 'ABC' is upper }}{{ range is callable }}{{ 'upper' is filter }}{{ 'odd' is test }})J",
       R"J({})J", R"J(TrueFalseTrueTrueTrueTrue)J"},
  });
}

TEST(JinjaMethods, StringsAndDicts) {
  run_cases({
      {R"J({{ '  x  '.strip() }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ 'xyx'.strip('x') }})J",
       R"J({})J", R"J(x|x  |  x|y)J"},
      {R"J({{ 'a b  c'.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }})J",
       R"J({})J", R"J(['a', 'b', 'c'] ['a', 'b', '', 'c'] ['a', 'b,c'] ['a,b', 'c'])J"},
      {R"J({{ 'abc'.startswith('ab') }}{{ 'abc'.startswith(('x', 'a')) }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith('b', 1) }})J",
       R"J({})J", R"J(TrueTrueTrueTrue)J"},
      {R"J({{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ "they're bill's".title() }} {{ 'hELLO'.capitalize() }})J",
       R"J({})J", R"J(ABC abc They'Re Bill'S Hello)J"},
      {R"J({{ 'aaa'.replace('a', 'b') }} {{ 'aaa'.replace('a', 'b', 1) }} {{ 'héllo'.find('l') }} {{ 'abc'.find('z') }} {{ 'abab'.count('ab') }})J",
       R"J({})J", R"J(bbb baa 2 -1 2)J"},
      {R"J({{ ', '.join(['a', 'b']) }} {{ 'a\nb\r\nc'.splitlines() }} {{ 'x.json'.removesuffix('.json') }} {{ '12'.isdigit() }})J",
       R"J({})J", R"J(a, b ['a', 'b', 'c'] x True)J"},
      {R"J({{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 5) }} {{ d.keys() | list }} {{ d.values() | list }} {{ d.items() | list }})J",
       R"J({"d": {"a": 1, "b": 2}})J", R"J(1 None 5 ['a', 'b'] [1, 2] [('a', 1), ('b', 2)])J"},
      {R"J({{ d.keys() | length }} {{ 'a' in d.keys() }} {{ [1, 2, 1].count(1) }} {{ [1, 2].index(2) }})J",
       R"J({"d": {"a": 1, "b": 2}})J", R"J(2 True 2 1)J"},
      {R"J([{{ [1].append }}] {{ dict(a=1, b='x') }} {{ dict({'k': 1}) }})J", R"J({})J",
       R"J([] {'a': 1, 'b': 'x'} {'k': 1})J"},
  });
}

TEST(JinjaErrors, ParseErrorsHaveLineAndColumn) {
  EXPECT_EQ(error_of("{% if x %}"),
            "[jinja] 1:11: unexpected end of template, expected 'elif' or 'else' or 'endif'");
  EXPECT_EQ(error_of("ok\n  {% endfor %}"), "[jinja] 2:6: unexpected 'endfor'");
  EXPECT_EQ(error_of("{% frobnicate %}"), "[jinja] 1:4: unknown statement 'frobnicate'");
  EXPECT_EQ(error_of("{% extends 'base' %}"), "[jinja] 1:4: unsupported statement 'extends'");
  EXPECT_EQ(error_of("{% call m() %}{% endcall %}"), "[jinja] 1:4: unsupported statement 'call'");
  EXPECT_EQ(error_of("{% with a = 1 %}{% endwith %}"), "[jinja] 1:4: unsupported statement 'with'");
  EXPECT_EQ(error_of("{% for x in y recursive %}{% endfor %}"),
            "[jinja] 1:15: recursive loops are not supported");
  EXPECT_EQ(error_of("{{ x | urlize }}"), "[jinja] 1:8: unsupported filter 'urlize'");
  EXPECT_EQ(error_of("{{ f(*args) }}"),
            "[jinja] 1:6: *args and **kwargs in calls are not supported");
  EXPECT_EQ(error_of("{% macro m() %}{{ varargs }}{% endmacro %}"),
            "[jinja] 1:4: macros using 'varargs' are not supported");
  EXPECT_EQ(error_of("{% break %}"), "[jinja] 1:4: 'break' outside of a loop");
  EXPECT_EQ(error_of("{{ 'abc }}"), "[jinja] 1:4: unterminated string literal");
  EXPECT_EQ(error_of("{# never closed"), "[jinja] 1:1: missing end of comment tag");
  EXPECT_EQ(error_of("a{{"), "[jinja] 1:2: unexpected end of template, expected '}}'");
  EXPECT_EQ(error_of("{{ (1 + 2 }}"), "[jinja] 1:11: unexpected '}', expected ')'");
  EXPECT_EQ(error_of("{{ x }"), "[jinja] 1:6: unexpected '}'");
  EXPECT_EQ(error_of("{% set x %}"), "[jinja] 1:12: unexpected end of template, expected 'endset'");
  EXPECT_EQ(error_of("{{ a.b[1, 2] }}"), "[jinja] 1:7: tuple subscripts are not supported");
  EXPECT_EQ(error_of("{{ '\\ud800' }}"), "[jinja] 1:4: surrogate escapes are not supported");
  EXPECT_EQ(error_of("ok \xff"), "[jinja] template is not valid UTF-8");
}

TEST(JinjaErrors, RenderErrorsMatchJinja) {
  EXPECT_EQ(error_of("{{ foo.bar }}"), "[jinja] 1:7: 'foo' is undefined");
  EXPECT_EQ(error_of("{{ d.x.y }}", R"({"d": {}})"),
            "[jinja] 1:7: 'dict object' has no attribute 'x'");
  EXPECT_EQ(error_of("{{ l[3][0] }}", R"({"l": [1]})"),
            "[jinja] 1:8: 'list object' has no element 3");
  EXPECT_EQ(error_of("\n\n   {{ x + 1 }}"), "[jinja] 3:9: 'x' is undefined");
  EXPECT_EQ(error_of("{{ 'a' + 1 }}"),
            "[jinja] 1:8: can only concatenate str (not \"int\") to str");
  EXPECT_EQ(error_of("{{ 'a' < 1 }}"),
            "[jinja] 1:8: '<' not supported between instances of 'str' and 'int'");
  EXPECT_EQ(error_of("{{ 1 // 0 }}"), "[jinja] 1:6: integer division or modulo by zero");
  EXPECT_EQ(error_of("{% for x in 5 %}{% endfor %}"), "[jinja] 1:4: 'int' object is not iterable");
  EXPECT_EQ(error_of("{{ [1].append(2) }}"),
            "[jinja] 1:14: access to attribute 'append' of 'list' object is unsafe.");
  EXPECT_EQ(error_of("{{ 'x'.format(1) }}"),
            "[jinja] 1:14: the Python method str.format() is not supported");
  EXPECT_EQ(error_of("{{ undefined_fn() }}"), "[jinja] 1:16: 'undefined_fn' is undefined");
  EXPECT_EQ(error_of("{{ x | tojson }}"),
            "[jinja] 1:8: Object of type Undefined is not JSON serializable");
  EXPECT_EQ(error_of("{% set x = 1 %}{% set x.a = 2 %}"),
            "[jinja] 1:19: cannot assign attribute on non-namespace object");
  EXPECT_EQ(error_of("{% set ns = namespace() %}{% set ns._p = 1 %}"),
            "[jinja] 1:30: cannot store the underscore-prefixed attribute '_p' on a namespace");
  EXPECT_EQ(error_of("{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"),
            "[jinja] 1:35: macro 'f' takes not more than 1 argument(s)");
  EXPECT_EQ(error_of("{{ range(3) }}"), "[jinja] 1:1: printing a range object is not supported");
  EXPECT_EQ(error_of("{{ [1] | select }}"),
            "[jinja] 1:1: printing a generator object is not supported");
  EXPECT_EQ(error_of("{{ [1] | select | length }}"),
            "[jinja] 1:19: object of type 'generator' has no len()");
  EXPECT_EQ(error_of("{{ 'x' % 1 }}"), "[jinja] 1:8: string formatting with '%' is not supported");
  EXPECT_EQ(error_of("{{ 'Ա' | upper }}"), "[jinja] 1:10: upper-casing U+0531 is not supported");
  EXPECT_EQ(error_of("{{ 9223372036854775807 + 1 }}"),
            "[jinja] 1:24: integer overflow (Python's unbounded integers are not supported)");
}

TEST(JinjaErrors, RaiseException) {
  try {
    render("{{ raise_exception('bad ' ~ 1) }}");
    FAIL();
  } catch (const TemplateException& e) {
    EXPECT_EQ(e.message(), "bad 1");
    EXPECT_EQ(std::string(e.what()), "[jinja] bad 1");
  }
}

TEST(JinjaLimits, RunawayInputFailsCleanly) {
  // Unbounded macro recursion.
  EXPECT_EQ(error_of("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}"),
            "[jinja] 1:20: macro calls nested deeper than 64");
  // Output size.
  RenderOptions small;
  small.max_output_bytes = 1000;
  EXPECT_EQ(error_of("{% for i in range(100) %}0123456789abcdef{% endfor %}", "{}", small),
            "[jinja] 1:26: string of 1008 bytes exceeds the output limit of 1000");
  EXPECT_EQ(error_of("{{ 'x' * 100000 }}", "{}", small),
            "[jinja] 1:8: string of 1001 bytes exceeds the output limit of 1000");
  EXPECT_EQ(error_of("{% set ns = namespace(s='ab') %}{% for i in range(20) %}{% set ns.s = ns.s ~ "
                     "ns.s %}{% endfor %}",
                     "{}", small),
            "[jinja] 1:76: string of 1024 bytes exceeds the output limit of 1000");
  // Steps and list sizes.
  RenderOptions few;
  few.max_steps = 1000;
  EXPECT_EQ(error_of("{% for i in range(10000) %}{% endfor %}", "{}", few),
            "[jinja] 1:4: template exceeded the limit of 1000 evaluation steps");
  EXPECT_EQ(error_of("{{ range(10000000) | length }}"),
            "[jinja] 1:9: list of 1048577 items exceeds the limit of 1048576");
  // Deep nesting at parse time.
  std::string deep = "{{ " + std::string(200, '(') + "1" + std::string(200, ')') + " }}";
  EXPECT_EQ(error_of(deep), "[jinja] 1:104: template nested too deeply (limit 100)");
  std::string deep_blocks;
  for (int i = 0; i < 150; ++i) deep_blocks += "{% if true %}";
  EXPECT_EQ(error_of(deep_blocks), "[jinja] 1:1304: template nested too deeply (limit 100)");
}

TEST(JinjaApi, ReferenceCyclesAreFreed) {
  // A macro holds its defining scope and namespaces can hold themselves;
  // the leak checker of the sanitizer build watches these.
  EXPECT_EQ(render("{% set ns = namespace() %}{% macro m() %}x{% endmacro %}{% set ns.m = m %}"
                   "{% set ns.self = ns %}{% set ns.l = [ns] %}{{ ns.m() }}{{ ns.self.m() }}"),
            "xx");
  EXPECT_EQ(
      render("{% for i in [1, 2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}"),
      "12");
}

TEST(JinjaApi, ContextShadowsGlobalsAndOptions) {
  EXPECT_EQ(render("{{ range }}", R"({"range": "mine"})"), "mine");
  Template plain("{% if true %}\n  x\n{% endif %}", LexOptions{false, false});
  EXPECT_EQ(plain.render(from_json(nlohmann::ordered_json::object())), "\n  x\n");
  Template t("{{ greeting | upper }}, {{ name }}!");
  auto ctx = std::make_shared<DictData>();
  ctx->set("greeting", Value("hello"));
  ctx->set("name", Value("ferry"));
  EXPECT_EQ(t.render(Value::dict(ctx)), "HELLO, ferry!");
  EXPECT_THROW(t.render(Value("not a dict")), Error);
  nlohmann::ordered_json bad = {{"greeting", std::string("\xc3")}};
  EXPECT_THROW(from_json(bad), Error);
}

}  // namespace
}  // namespace ferry::text::jinja
