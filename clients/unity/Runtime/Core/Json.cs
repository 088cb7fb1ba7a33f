using System;
using System.Collections;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace Xlm.Sidecar
{
    /// <summary>
    /// A JSON object as the reader returns it: values are JsonObject, List&lt;object&gt;, string,
    /// double, bool or null. The getters follow protobuf's JSON mapping, so a 64-bit integer may come
    /// as a string or a number and a missing field reads as its default.
    /// </summary>
    public sealed class JsonObject : Dictionary<string, object>
    {
        public JsonObject() : base(StringComparer.Ordinal) { }

        public string GetString(string key, string fallback = "")
        {
            object value;
            return TryGetValue(key, out value) && value is string ? (string)value : fallback;
        }

        public bool GetBool(string key)
        {
            object value;
            return TryGetValue(key, out value) && value is bool && (bool)value;
        }

        public double GetDouble(string key)
        {
            object value;
            if (!TryGetValue(key, out value) || value == null)
                return 0;
            if (value is double)
                return (double)value;
            // The mapping writes "NaN" and "Infinity" as strings.
            double parsed;
            var text = value as string;
            return text != null && double.TryParse(text, NumberStyles.Float, CultureInfo.InvariantCulture, out parsed) ? parsed : 0;
        }

        public uint GetUInt32(string key)
        {
            var value = GetDouble(key);
            return value <= 0 ? 0u : value >= uint.MaxValue ? uint.MaxValue : (uint)value;
        }

        public int GetInt32(string key)
        {
            var value = GetDouble(key);
            return value <= int.MinValue ? int.MinValue : value >= int.MaxValue ? int.MaxValue : (int)value;
        }

        /// <summary>uint64 fields come as strings (exact) or, from other writers, as numbers.</summary>
        public ulong GetUInt64(string key)
        {
            object value;
            if (!TryGetValue(key, out value) || value == null)
                return 0;
            ulong parsed;
            var text = value as string;
            if (text != null)
                return ulong.TryParse(text, NumberStyles.None, CultureInfo.InvariantCulture, out parsed) ? parsed : 0;
            var number = value is double ? (double)value : 0;
            return number <= 0 ? 0 : number >= ulong.MaxValue ? ulong.MaxValue : (ulong)number;
        }

        public long GetInt64(string key)
        {
            object value;
            if (!TryGetValue(key, out value) || value == null)
                return 0;
            long parsed;
            var text = value as string;
            if (text != null)
                return long.TryParse(text, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out parsed) ? parsed : 0;
            return value is double ? (long)(double)value : 0;
        }

        /// <summary>The nested object, or null when absent.</summary>
        public JsonObject GetObject(string key)
        {
            object value;
            return TryGetValue(key, out value) ? value as JsonObject : null;
        }

        /// <summary>The array, or an empty list when absent.</summary>
        public List<object> GetArray(string key)
        {
            object value;
            return TryGetValue(key, out value) && value is List<object> ? (List<object>)value : new List<object>();
        }

        public override string ToString()
        {
            return Json.Write(this);
        }
    }

    /// <summary>
    /// A small JSON reader and writer. Unity's player has no System.Text.Json and JsonUtility cannot
    /// read maps or tell a missing field from a default, so the client carries its own.
    /// </summary>
    public static class Json
    {
        /// <summary>Nesting deeper than this is refused rather than risking the stack.</summary>
        public const int MaxDepth = 128;

        public static object Parse(string text)
        {
            if (text == null)
                throw new ArgumentNullException("text");
            var reader = new Reader(text);
            reader.SkipWhitespace();
            var value = reader.ReadValue(0);
            reader.SkipWhitespace();
            if (!reader.AtEnd)
                throw reader.Error("unexpected text after the JSON value");
            return value;
        }

        public static JsonObject ParseObject(string text)
        {
            var value = Parse(text) as JsonObject;
            if (value == null)
                throw new FormatException("expected a JSON object");
            return value;
        }

        /// <summary>Writes dictionaries, lists, strings, numbers, bools, null and byte arrays (as base64).</summary>
        public static string Write(object value)
        {
            var builder = new StringBuilder();
            WriteValue(builder, value, 0);
            return builder.ToString();
        }

        static void WriteValue(StringBuilder b, object value, int depth)
        {
            if (depth > MaxDepth)
                throw new ArgumentException("value nests deeper than " + MaxDepth + " levels");
            if (value == null) { b.Append("null"); return; }
            var text = value as string;
            if (text != null) { WriteString(b, text); return; }
            if (value is bool) { b.Append((bool)value ? "true" : "false"); return; }
            var bytes = value as byte[];
            if (bytes != null) { WriteString(b, Convert.ToBase64String(bytes)); return; }
            if (value is double || value is float)
            {
                var d = Convert.ToDouble(value, CultureInfo.InvariantCulture);
                if (double.IsNaN(d)) b.Append("\"NaN\"");
                else if (double.IsPositiveInfinity(d)) b.Append("\"Infinity\"");
                else if (double.IsNegativeInfinity(d)) b.Append("\"-Infinity\"");
                else b.Append(d.ToString("R", CultureInfo.InvariantCulture));
                return;
            }
            if (value is int || value is uint || value is long || value is ulong || value is short || value is ushort || value is byte || value is sbyte)
            {
                b.Append(Convert.ToString(value, CultureInfo.InvariantCulture));
                return;
            }
            var map = value as IDictionary;
            if (map != null)
            {
                b.Append('{');
                var first = true;
                foreach (DictionaryEntry entry in map)
                {
                    if (!first) b.Append(',');
                    first = false;
                    WriteString(b, Convert.ToString(entry.Key, CultureInfo.InvariantCulture));
                    b.Append(':');
                    WriteValue(b, entry.Value, depth + 1);
                }
                b.Append('}');
                return;
            }
            var list = value as IEnumerable;
            if (list != null)
            {
                b.Append('[');
                var first = true;
                foreach (var item in list)
                {
                    if (!first) b.Append(',');
                    first = false;
                    WriteValue(b, item, depth + 1);
                }
                b.Append(']');
                return;
            }
            throw new ArgumentException("cannot write a " + value.GetType().Name + " as JSON");
        }

        static void WriteString(StringBuilder b, string s)
        {
            b.Append('"');
            for (var i = 0; i < s.Length; i++)
            {
                var c = s[i];
                switch (c)
                {
                    case '"': b.Append("\\\""); break;
                    case '\\': b.Append("\\\\"); break;
                    case '\n': b.Append("\\n"); break;
                    case '\r': b.Append("\\r"); break;
                    case '\t': b.Append("\\t"); break;
                    case '\b': b.Append("\\b"); break;
                    case '\f': b.Append("\\f"); break;
                    default:
                        if (char.IsHighSurrogate(c) && i + 1 < s.Length && char.IsLowSurrogate(s[i + 1]))
                        {
                            b.Append(c).Append(s[++i]);
                        }
                        else if (char.IsSurrogate(c))
                        {
                            // A lone surrogate has no UTF-8 form; the daemon would refuse the frame.
                            b.Append('\uFFFD');
                        }
                        else if (c < 0x20)
                        {
                            b.Append("\\u").Append(((int)c).ToString("x4", CultureInfo.InvariantCulture));
                        }
                        else
                        {
                            b.Append(c);
                        }
                        break;
                }
            }
            b.Append('"');
        }

        sealed class Reader
        {
            readonly string text;
            int pos;

            public Reader(string text) { this.text = text; }

            public bool AtEnd { get { return pos >= text.Length; } }

            public FormatException Error(string what)
            {
                return new FormatException("JSON: " + what + " at character " + pos);
            }

            public void SkipWhitespace()
            {
                while (pos < text.Length)
                {
                    var c = text[pos];
                    if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
                        return;
                    pos++;
                }
            }

            public object ReadValue(int depth)
            {
                if (depth > MaxDepth)
                    throw Error("nesting deeper than " + MaxDepth + " levels");
                if (AtEnd)
                    throw Error("unexpected end of text");
                var c = text[pos];
                switch (c)
                {
                    case '{': return ReadObject(depth);
                    case '[': return ReadArray(depth);
                    case '"': return ReadString();
                    case 't': Expect("true"); return true;
                    case 'f': Expect("false"); return false;
                    case 'n': Expect("null"); return null;
                    default:
                        if (c == '-' || c >= '0' && c <= '9')
                            return ReadNumber();
                        throw Error("unexpected character '" + c + "'");
                }
            }

            void Expect(string word)
            {
                if (string.CompareOrdinal(text, pos, word, 0, word.Length) != 0)
                    throw Error("expected " + word);
                pos += word.Length;
            }

            JsonObject ReadObject(int depth)
            {
                var result = new JsonObject();
                pos++;
                SkipWhitespace();
                if (pos < text.Length && text[pos] == '}') { pos++; return result; }
                while (true)
                {
                    SkipWhitespace();
                    if (AtEnd || text[pos] != '"')
                        throw Error("expected a quoted key");
                    var key = ReadString();
                    SkipWhitespace();
                    if (AtEnd || text[pos] != ':')
                        throw Error("expected ':'");
                    pos++;
                    SkipWhitespace();
                    result[key] = ReadValue(depth + 1);
                    SkipWhitespace();
                    if (AtEnd)
                        throw Error("unterminated object");
                    if (text[pos] == ',') { pos++; continue; }
                    if (text[pos] == '}') { pos++; return result; }
                    throw Error("expected ',' or '}'");
                }
            }

            List<object> ReadArray(int depth)
            {
                var result = new List<object>();
                pos++;
                SkipWhitespace();
                if (pos < text.Length && text[pos] == ']') { pos++; return result; }
                while (true)
                {
                    SkipWhitespace();
                    result.Add(ReadValue(depth + 1));
                    SkipWhitespace();
                    if (AtEnd)
                        throw Error("unterminated array");
                    if (text[pos] == ',') { pos++; continue; }
                    if (text[pos] == ']') { pos++; return result; }
                    throw Error("expected ',' or ']'");
                }
            }

            string ReadString()
            {
                pos++; // opening quote
                StringBuilder b = null;
                var start = pos;
                while (true)
                {
                    if (AtEnd)
                        throw Error("unterminated string");
                    var c = text[pos];
                    if (c == '"')
                    {
                        string result;
                        if (b == null)
                            result = text.Substring(start, pos - start);
                        else
                            result = b.Append(text, start, pos - start).ToString();
                        pos++;
                        return result;
                    }
                    if (c < 0x20)
                        throw Error("control character in a string");
                    if (c != '\\') { pos++; continue; }
                    if (b == null) b = new StringBuilder();
                    b.Append(text, start, pos - start);
                    pos++;
                    if (AtEnd)
                        throw Error("unterminated escape");
                    var e = text[pos++];
                    switch (e)
                    {
                        case '"': b.Append('"'); break;
                        case '\\': b.Append('\\'); break;
                        case '/': b.Append('/'); break;
                        case 'b': b.Append('\b'); break;
                        case 'f': b.Append('\f'); break;
                        case 'n': b.Append('\n'); break;
                        case 'r': b.Append('\r'); break;
                        case 't': b.Append('\t'); break;
                        case 'u':
                            if (pos + 4 > text.Length)
                                throw Error("short \\u escape");
                            int code;
                            if (!int.TryParse(text.Substring(pos, 4), NumberStyles.AllowHexSpecifier, CultureInfo.InvariantCulture, out code))
                                throw Error("bad \\u escape");
                            b.Append((char)code);
                            pos += 4;
                            break;
                        default:
                            throw Error("unknown escape \\" + e);
                    }
                    start = pos;
                }
            }

            double ReadNumber()
            {
                var start = pos;
                if (text[pos] == '-') pos++;
                while (pos < text.Length)
                {
                    var c = text[pos];
                    if (c >= '0' && c <= '9' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '-')
                        pos++;
                    else
                        break;
                }
                double value;
                if (!double.TryParse(text.Substring(start, pos - start), NumberStyles.Float, CultureInfo.InvariantCulture, out value))
                    throw Error("bad number");
                return value;
            }
        }
    }
}
