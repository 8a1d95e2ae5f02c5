// JSON schemas compiled to grammars: each supported keyword admits what it should and nothing
// else, and everything unsupported is refused naming the keyword and its path.
#include "grammar/json_schema.h"

#include <gtest/gtest.h>

#include <string>

#include "grammar_test_util.h"

namespace kvasir::grammar {
namespace {

using testing::FullMatch;

std::shared_ptr<const Grammar> FromSchema(const std::string& schema_text) {
  auto schema = ParseJsonText(schema_text);
  EXPECT_TRUE(schema.ok()) << schema.status().message();
  if (!schema.ok()) return nullptr;
  auto text = JsonSchemaGrammarText(*schema);
  EXPECT_TRUE(text.ok()) << text.status().message();
  if (!text.ok()) return nullptr;
  return testing::MustParse(*text);
}

std::string Refusal(const std::string& schema_text) {
  auto schema = ParseJsonText(schema_text);
  if (!schema.ok()) return schema.status().message();
  auto text = JsonSchemaGrammarText(*schema);
  if (!text.ok()) return text.status().message();
  auto g = Grammar::Parse(*text);
  if (!g.ok()) return g.status().message();
  return "(compiled)";
}

void ExpectAll(const std::shared_ptr<const Grammar>& g, std::initializer_list<const char*> good,
               std::initializer_list<const char*> bad) {
  ASSERT_TRUE(g);
  for (const char* s : good) EXPECT_TRUE(FullMatch(g, s)) << "should accept: " << s;
  for (const char* s : bad) EXPECT_FALSE(FullMatch(g, s)) << "should refuse: " << s;
}

TEST(JsonSchema, AnyObjectGrammarIsJsonWithBoundedWhitespace) {
  auto g = testing::MustParse(JsonObjectGrammarText());
  ExpectAll(g,
            {"{}", "{ }", "{\"a\": 1}", "{\"a\":[1,2.5e-3,-0,true,false,null,\"x\"]}",
             "{\n  \"a\": {\n    \"b\": [\n      {}\n    ]\n  }\n}",
             "{\"\\u00e9\\n\\\"\": \"\\ud83d\\ude00\"}", "{\"k\": \"\xE4\xBD\xA0\"}"},
            {"", "[]", "{", "{\"a\":}", "{\"a\": 01}", "{\"a\": 1,}", "{,}", "{\"a\" 1}",
             "{\"a\": \"\\ud800\"}", "{\"a\": \"\\ude00\\ud83d\"}", "{\"a\": \"\\x\"}",
             "{\"a\": \"tab\there\"}", "{   }", "{\"a\": 1.}", "{\"a\": .5}", "{\"a\": +1}",
             "{\"a\": \"\xC0\xAF\"}"});
  // Indentation is bounded (40 by default) so that blanks cannot go on forever.
  EXPECT_TRUE(FullMatch(g, "{\n" + std::string(40, ' ') + "}"));
  EXPECT_FALSE(FullMatch(g, "{\n" + std::string(41, ' ') + "}"));
}

TEST(JsonSchema, PropertiesInOrderRequiredAndOptional) {
  auto g = FromSchema(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["a", "c"]})");
  ExpectAll(g,
            {"{\"a\": 1, \"c\": true}", "{\"a\":1,\"b\":\"x\",\"c\":false}",
             "{ \"a\": 1 , \"c\": true }"},
            {"{\"c\": true, \"a\": 1}", "{\"a\": 1}", "{\"a\": 1, \"c\": true, \"d\": 1}",
             "{\"b\": \"x\", \"a\": 1, \"c\": true}", "{}", "{\"a\": \"1\", \"c\": true}"});
  auto optional = FromSchema(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "string"},
      "c": {"type": "boolean"}}})");
  ExpectAll(
      optional,
      {"{}", "{\"b\": \"x\"}", "{\"a\": 1, \"c\": true}", "{\"a\": 1, \"b\": \"\", \"c\": true}"},
      {"{,\"b\": \"x\"}", "{\"b\": \"x\",}", "{\"c\": true, \"b\": \"x\"}", "{\"d\": 1}"});
}

TEST(JsonSchema, PropertyNamesNeverClashWithRuleNames) {
  auto g = FromSchema(R"({"properties": {"value": {"type": "integer"}, "ws": {"type": "string"},
      "root": {"type": "null"}, "": {"type": "boolean"}, "a b/c~": {"const": 1}, "\u00e9\"": {}},
      "required": ["value", "ws", "root", "", "a b/c~", "\u00e9\""]})");
  ExpectAll(g, {R"({"value": 1, "ws": "x", "root": null, "": true, "a b/c~": 1, "é\"": 0})"},
            {R"({"value": 1})"});
}

TEST(JsonSchema, AdditionalPropertiesAbsentFalseTrueOrASchema) {
  auto schema = FromSchema(R"({"type": "object", "properties": {"a": {"type": "integer"}},
      "additionalProperties": {"type": "string"}})");
  ExpectAll(schema,
            {"{\"a\": 1, \"x\": \"y\"}", "{\"x\": \"y\", \"ab\": \"z\"}", "{\"\": \"s\"}", "{}"},
            {"{\"x\": 1}", "{\"a\": 1, \"a\": 2}", "{\"a\": \"s\"}", "{\"x\": \"y\", \"a\": 1}"});
  auto any = FromSchema(R"({"type": "object", "additionalProperties": true})");
  ExpectAll(any, {"{}", "{\"q\": [1, {\"r\": null}]}"}, {"[]"});
  auto bare = FromSchema(R"({"type": "object"})");
  ExpectAll(bare, {"{\"q\": 1}"}, {"1"});
  auto none =
      FromSchema(R"({"properties": {"a": {"type": "null"}}, "additionalProperties": false})");
  ExpectAll(none, {"{}", "{\"a\": null}"}, {"{\"b\": null}"});
  // A listed property with the schema false may not appear at all, even as an additional one.
  auto banned = FromSchema(R"({"properties": {"a": false}, "additionalProperties": true})");
  ExpectAll(banned, {"{\"b\": 1}", "{\"aa\": 1}"}, {"{\"a\": 1}"});
}

TEST(JsonSchema, ArraysWithItemsAndCounts) {
  auto g = FromSchema(
      R"({"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 3})");
  ExpectAll(g, {"[1,2]", "[1, 2, 3]", "[ 1 , 2 ]"},
            {"[1]", "[1,2,3,4]", "[\"a\",\"b\"]", "[]", "[1,2,]"});
  ExpectAll(FromSchema(R"({"type": "array", "maxItems": 0})"), {"[]", "[ ]"}, {"[1]"});
  ExpectAll(FromSchema(R"({"type": "array", "items": false})"), {"[]"}, {"[null]"});
  ExpectAll(FromSchema(R"({"type": "array", "minItems": 1})"), {"[null]", "[1, \"a\", {}]"},
            {"[]"});
  ExpectAll(FromSchema(R"({"items": {"type": "string"}, "maxItems": 1})"), {"[]", "[\"a\"]"},
            {"[\"a\", \"b\"]"});
}

TEST(JsonSchema, EnumConstAndTypeLists) {
  auto g = FromSchema(R"({"enum": ["red", "green", 3, null, {"a": [1]}, "caf\u00e9"]})");
  ExpectAll(g, {"\"red\"", "3", "null", "{\"a\":[1]}", "\"caf\xC3\xA9\""},
            {"\"blue\"", "\"Red\"", "3.0", "{\"a\": [1]}", "\"cafe\""});
  ExpectAll(FromSchema(R"({"const": {"k": "v"}})"), {"{\"k\":\"v\"}"}, {"{\"k\":\"w\"}"});
  // A type next to enum keeps the values of that type.
  ExpectAll(FromSchema(R"({"type": "string", "enum": ["a", 1]})"), {"\"a\""}, {"1"});
  ExpectAll(FromSchema(R"({"type": ["string", "null"], "maxLength": 2})"), {"\"ab\"", "null"},
            {"\"abc\"", "1"});
  ExpectAll(FromSchema(R"({"type": "boolean"})"), {"true", "false"}, {"1", "\"true\""});
  ExpectAll(FromSchema("true"), {"1", "{\"a\": []}"}, {""});
  ExpectAll(FromSchema("{}"), {"\"x\"", "[null]"}, {"nul"});
}

TEST(JsonSchema, StringLengthCountsCodePoints) {
  auto g = FromSchema(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  ExpectAll(g,
            {"\"ab\"", "\"abc\"", "\"a\xC3\xA9\"", "\"\\n\\t\"", "\"\\ud83d\\ude00x\"",
             "\"\xF0\x9F\x98\x80\xF0\x9F\x98\x80\""},
            {"\"a\"", "\"abcd\"", "\"\xC3\xA9\"", "\"\\\\\"", "\"\\ud83d\\ude00\""});
}

TEST(JsonSchema, FormatsProduceOnlyValidValues) {
  ExpectAll(
      FromSchema(R"({"type": "string", "format": "date"})"),
      {"\"2024-02-29\"", "\"2000-02-29\"", "\"2023-12-31\"", "\"0000-02-29\"", "\"2023-04-30\""},
      {"\"2023-02-29\"", "\"1900-02-29\"", "\"2023-04-31\"", "\"2023-13-01\"", "\"2023-00-10\"",
       "\"2023-01-00\"", "\"23-01-01\""});
  ExpectAll(FromSchema(R"({"format": "time"})"),
            {"\"12:34:56Z\"", "\"23:59:59.123+05:30\"", "\"00:00:00-12:00\""},
            {"\"24:00:00Z\"", "\"12:34:56\"", "\"12:60:00Z\"", "\"12:34:56z\""});
  ExpectAll(FromSchema(R"({"format": "date-time"})"), {"\"2024-01-31T08:00:00Z\""},
            {"\"2024-01-31 08:00:00Z\""});
  ExpectAll(FromSchema(R"({"format": "uuid"})"), {"\"123e4567-e89b-12d3-a456-426614174000\""},
            {"\"123e4567e89b12d3a456426614174000\"", "\"123e4567-e89b-12d3-a456-42661417400g\""});
  ExpectAll(FromSchema(R"({"format": "email"})"), {"\"a.b+c@ex-ample.co\"", "\"x_1@a.b.c\""},
            {"\"a..b@x.com\"", "\"a@b\"", "\"@x.com\"", "\"a@-x.com\"", "\"a@x-.com\"",
             "\"a b@x.com\"", "\".a@x.com\""});
  ExpectAll(FromSchema(R"({"format": "ipv4"})"),
            {"\"192.168.0.1\"", "\"255.255.255.255\"", "\"0.0.0.0\""},
            {"\"256.1.1.1\"", "\"01.1.1.1\"", "\"1.1.1\""});
}

TEST(JsonSchema, PatternsMatchAnywhereUnlessAnchored) {
  ExpectAll(FromSchema(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}$"})"), {"\"AB-123\""},
            {"\"AB-12\"", "\"xAB-123\"", "\"ab-123\""});
  ExpectAll(FromSchema(R"({"pattern": "abc"})"), {"\"abc\"", "\"xxabcyy\"", "\"\\n abc\""},
            {"\"ab\"", "\"acb\""});
  // Characters JSON must escape are written as escapes.
  ExpectAll(FromSchema(R"({"pattern": "^a\"b\\\\c\\n$"})"), {"\"a\\\"b\\\\c\\n\""},
            {"\"a\"b\\c\""});
  ExpectAll(FromSchema(R"({"pattern": "^(?:cat|dog)s?$|^[^a-z]+$"})"),
            {"\"cat\"", "\"dogs\"", "\"ABC 1\"", "\"\xC3\x89\""},
            {"\"cow\"", "\"cats!\"", "\"Ab\""});
  ExpectAll(FromSchema(R"({"pattern": "^.{2}$"})"), {"\"ab\"", "\"\xC3\xA9\xC3\xA9\""},
            {"\"a\"", "\"a\\n\""});
  ExpectAll(FromSchema(R"({"pattern": "^\\w+\\s\\S*?$"})"), {"\"a_1 xyz\"", "\"a \""}, {"\"a  \""});
}

TEST(JsonSchema, IntegerBoundsAreExact) {
  auto g = FromSchema(R"({"type": "integer", "minimum": -1234, "maximum": 5678})");
  ASSERT_TRUE(g);
  for (int v = -3000; v <= 7000; ++v) {
    ASSERT_EQ(FullMatch(g, std::to_string(v)), v >= -1234 && v <= 5678) << v;
  }
  ExpectAll(g, {"0"}, {"-0", "007", "1.0", "+5"});
  ExpectAll(FromSchema(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10.5})"),
            {"1", "10"}, {"0", "11", "-1"});
  ExpectAll(FromSchema(R"({"type": "integer", "minimum": 1.5})"), {"2", "99999999999"}, {"1"});
  ExpectAll(FromSchema(R"({"type": "integer", "maximum": -100})"), {"-100", "-123456"},
            {"-99", "0"});
  ExpectAll(FromSchema(R"({"type": "integer"})"), {"0", "-7", "12345678901234567890"},
            {"-0", "123456789012345678901", "01"});
  ExpectAll(
      FromSchema(
          R"({"type": "integer", "minimum": -9223372036854775808, "maximum": 18446744073709551615})"),
      {"-9223372036854775808", "18446744073709551615"},
      {"-9223372036854775809", "18446744073709551616"});
}

TEST(JsonSchema, NumberBoundsWithWholeNumbers) {
  ExpectAll(FromSchema(R"({"type": "number", "minimum": 0, "maximum": 10})"),
            {"0", "10", "10.0", "10.000", "9.999", "0.5", "3"},
            {"10.5", "-0.5", "10.01", "1e2", "-1", "11"});
  ExpectAll(FromSchema(R"({"type": "number", "minimum": -2, "maximum": -1})"),
            {"-1.5", "-2.0", "-1", "-2"}, {"-2.5", "-0.5", "0", "-2.01"});
  ExpectAll(FromSchema(R"({"type": "number", "minimum": 0})"), {"0", "0.25", "123.5"},
            {"-0.1", "-1"});
  ExpectAll(FromSchema(R"({"type": "number", "maximum": 0})"), {"0", "-0.25", "-123.5", "-0"},
            {"0.1", "1"});
  ExpectAll(FromSchema(R"({"type": "number"})"), {"1", "-1.5e+10", "0.0"}, {"1e", "--1"});
}

TEST(JsonSchema, AlternativesAndSingleAllOf) {
  ExpectAll(FromSchema(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})"),
            {"1", "\"a\""}, {"\"ab\"", "null"});
  ExpectAll(FromSchema(R"({"oneOf": [{"const": 1}, {"const": 2}]})"), {"1", "2"}, {"3"});
  ExpectAll(FromSchema(R"({"allOf": [{"type": "null"}]})"), {"null"}, {"1"});
}

TEST(JsonSchema, RecursiveReferences) {
  auto g = FromSchema(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}},
      "required": ["v", "next"]}}, "$ref": "#/$defs/node"})");
  ExpectAll(g, {"{\"v\": 1, \"next\": null}", "{\"v\": 1, \"next\": {\"v\": 2, \"next\": null}}"},
            {"{\"v\": 1}", "{\"v\": 1, \"next\": {\"v\": 2}}"});
  auto tree = FromSchema(R"({"type": "object", "properties": {"kids": {"type": "array",
      "items": {"$ref": "#"}}}, "definitions": {"a/b": {"type": "string"}}})");
  ExpectAll(tree, {"{}", "{\"kids\": [{}, {\"kids\": []}]}"}, {"{\"kids\": [1]}"});
  ExpectAll(
      FromSchema(R"({"definitions": {"a/b": {"type": "string"}}, "$ref": "#/definitions/a~1b"})"),
      {"\"s\""}, {"1"});
}

TEST(JsonSchema, UnsupportedKeywordsAreRefusedWithTheirPath) {
  EXPECT_EQ(Refusal(R"({"properties": {"age": {"type": "integer", "multipleOf": 5}}})"),
            "json schema: at #/properties/age: keyword 'multipleOf' is not supported");
  EXPECT_EQ(Refusal(R"({"type": "array", "uniqueItems": true})"),
            "json schema: at #: keyword 'uniqueItems' is not supported");
  EXPECT_EQ(Refusal(R"({"type": "object", "patternProperties": {"^x": {}}})"),
            "json schema: at #: keyword 'patternProperties' is not supported");
  EXPECT_EQ(Refusal(R"({"items": {"not": {"type": "null"}}})"),
            "json schema: at #/items: keyword 'not' is not supported");
  EXPECT_EQ(Refusal(R"({"type": "object", "minProperties": 1})"),
            "json schema: at #: keyword 'minProperties' is not supported");
  EXPECT_EQ(Refusal(R"({"$ref": "http://example.com/s.json"})"),
            "json schema: at #: '$ref' \"http://example.com/s.json\": only #, #/$defs/NAME and "
            "#/definitions/NAME are supported");
  EXPECT_EQ(Refusal(R"({"$ref": "#/$defs/missing"})"),
            "json schema: at #: '$ref' \"#/$defs/missing\" names a schema that does not exist");
  EXPECT_EQ(Refusal(R"({"allOf": [{"type": "integer"}, {"minimum": 1}]})"),
            "json schema: at #: 'allOf' is supported with exactly one schema");
  EXPECT_EQ(Refusal(R"({"type": "float"})"),
            "json schema: at #: 'type' \"float\" is not one of null, boolean, integer, number, "
            "string, array, object");
  EXPECT_EQ(Refusal(R"({"type": "string", "format": "uri"})"),
            "json schema: at #: format 'uri' is not supported (supported: date, time, date-time, "
            "uuid, email, ipv4)");
  EXPECT_EQ(Refusal(R"j({"type": "string", "pattern": "a(?=b)"})j"),
            "json schema: at #: pattern 'a(?=b)': lookaround or group flags '(?=b' are not "
            "supported (at offset 1)");
  EXPECT_EQ(Refusal(R"({"pattern": "(a)\\1"})"),
            "json schema: at #: pattern '(a)\\1': backreferences are not supported (at offset 3)");
  EXPECT_EQ(
      Refusal(R"({"pattern": "\\bword"})"),
      "json schema: at #: pattern '\\bword': word boundary '\\b' is not supported (at offset 0)");
  EXPECT_EQ(
      Refusal(R"({"pattern": "a^b"})"),
      "json schema: at #: pattern 'a^b': '^' is supported only at the start of the pattern (at "
      "offset 1)");
  EXPECT_EQ(
      Refusal(R"({"type": "integer", "exclusiveMinimum": true, "minimum": 1})"),
      "json schema: at #: 'exclusiveMinimum' must be a number (the draft-4 boolean form of the "
      "exclusive bounds is not supported)");
  EXPECT_EQ(
      Refusal(R"({"type": "number", "minimum": 0.5})"),
      "json schema: at #: 'minimum' 0.5 on a number is not supported (only whole-number bounds "
      "are)");
  EXPECT_EQ(
      Refusal(R"({"type": "number", "exclusiveMaximum": 3})"),
      "json schema: at #: 'exclusiveMaximum' on a number is not supported (on an integer it is)");
  EXPECT_EQ(Refusal(R"({"type": "integer", "minimum": 5, "maximum": 4})"),
            "json schema: at #: no integer of at most 20 digits lies within the bounds");
  EXPECT_EQ(Refusal(R"({"type": "array", "items": [{"type": "integer"}]})"),
            "json schema: at #: 'items' as a list of schemas (tuples) is not supported");
  EXPECT_EQ(Refusal(R"({"properties": {"a": {}}, "required": ["b"]})"),
            "json schema: at #: required property \"b\" is not in 'properties'");
  EXPECT_EQ(Refusal(R"({"minLength": 1, "minItems": 1})"),
            "json schema: at #: keywords of several types (minItems, minLength) without 'type'");
  EXPECT_EQ(
      Refusal(R"({"type": "string", "pattern": "a", "maxLength": 3})"),
      "json schema: at #: 'pattern' together with 'minLength' or 'maxLength' is not supported");
  EXPECT_EQ(Refusal(R"({"anyOf": [{"type": "null"}], "type": "string"})"),
            "json schema: at #: 'type' next to 'anyOf' is not supported");
  EXPECT_EQ(Refusal(R"({"$ref": "#", "description": "ok", "minimum": 1})"),
            "json schema: at #: 'minimum' next to '$ref' is not supported");
  EXPECT_EQ(Refusal("false"), "json schema: at #: the schema false admits no value");
  EXPECT_EQ(Refusal(R"({"type": "string", "maxLength": 1000000})"),
            "json schema: at #: 'maxLength' 1000000 is over the supported limit of 100000");
  EXPECT_EQ(Refusal("[1]"), "json schema: at #: a schema must be an object or a boolean");
  // A schema that requires itself forever describes no finite value.
  EXPECT_EQ(
      Refusal(
          R"({"type": "object", "properties": {"child": {"$ref": "#"}}, "required": ["child"]})"),
      "grammar: rule 'root' can never end: every alternative needs itself or another rule that "
      "cannot end, or an empty character class");
}

TEST(JsonSchema, ResponseFormats) {
  auto rf = ParseJsonText(R"({"type": "json_schema", "json_schema": {"name": "x", "strict": true,
      "schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}})");
  ASSERT_TRUE(rf.ok());
  auto g = CompileResponseFormat(*rf);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(FullMatch(*g, "{\"n\": 5}"));
  EXPECT_FALSE(FullMatch(*g, "{}"));
  auto obj = CompileResponseFormat(nlohmann::ordered_json{{"type", "json_object"}});
  ASSERT_TRUE(obj.ok());
  EXPECT_TRUE(FullMatch(*obj, "{\"any\": [1]}"));
  EXPECT_FALSE(FullMatch(*obj, "[1]"));
  auto refusal = [](const char* text) {
    auto j = ParseJsonText(text);
    if (!j.ok()) return j.status().message();
    auto g = CompileResponseFormat(*j);
    return g.ok() ? std::string("(compiled)") : g.status().message();
  };
  EXPECT_EQ(refusal(R"({"type": "text"})"), "response_format: type 'text' needs no grammar");
  EXPECT_EQ(refusal(R"({"type": "xml"})"),
            "response_format: type 'xml' is not one of json_object, json_schema, text");
  EXPECT_EQ(refusal(R"({"type": "json_schema", "json_schema": {"name": "x"}})"),
            "response_format.json_schema.schema: missing");
  EXPECT_EQ(refusal(R"({"type": "json_schema", "json_schema": {"schema": {}, "extra": 1}})"),
            "response_format.json_schema: key 'extra' is not supported");
  EXPECT_EQ(refusal(R"({"type": "json_object", "schema": {}})"),
            "response_format: key 'schema' is not supported");
  EXPECT_EQ(refusal(R"([1, 2)"), "json: not valid JSON");
  EXPECT_EQ(refusal((std::string(100, '[') + std::string(100, ']')).c_str()),
            "json: nested deeper than 72");
}

}  // namespace
}  // namespace kvasir::grammar
