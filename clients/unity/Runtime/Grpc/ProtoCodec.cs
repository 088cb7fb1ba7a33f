using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Text;

namespace Xlm.Sidecar.Grpc
{
    enum ProtoType { Double, Float, Int64, UInt64, Int32, UInt32, Bool, String, Bytes, Message, Enum }

    sealed class ProtoField
    {
        public readonly int Number;
        public readonly string JsonName;
        public readonly ProtoType Type;
        /// <summary>The message or enum type's full name.</summary>
        public readonly string TypeName;
        public readonly bool Repeated;
        public readonly bool Map;
        /// <summary>Proto3 `optional` or a oneof member: sent even at its default value.</summary>
        public readonly bool Presence;

        public ProtoField(int number, string jsonName, ProtoType type, string typeName, bool repeated = false, bool map = false, bool presence = false)
        {
            Number = number;
            JsonName = jsonName;
            Type = type;
            TypeName = typeName;
            Repeated = repeated;
            Map = map;
            Presence = presence;
        }
    }

    sealed class ProtoMethod
    {
        public readonly string Path;
        public readonly string Request;
        public readonly string Response;
        public readonly bool ServerStreaming;

        public ProtoMethod(string path, string request, string response, bool serverStreaming)
        {
            Path = path;
            Request = request;
            Response = response;
            ServerStreaming = serverStreaming;
        }
    }

    /// <summary>
    /// Protobuf's binary format to and from the canonical JSON mapping the rest of the client speaks,
    /// driven by the generated table in ProtoSchema.cs. Decoded messages carry every field without
    /// presence at its default, as the daemon's WebSocket bridge writes them, so both transports hand
    /// the typed layer the same JSON.
    /// </summary>
    static partial class ProtoSchema
    {
        const int WireVarint = 0, WireFixed64 = 1, WireLength = 2, WireFixed32 = 5;

        public static byte[] Encode(string messageType, JsonObject json)
        {
            var output = new MemoryStream();
            WriteMessage(output, messageType, json ?? new JsonObject());
            return output.ToArray();
        }

        public static JsonObject Decode(string messageType, byte[] data, int offset, int count)
        {
            return ReadMessage(messageType, data, offset, offset + count, 0);
        }

        static ProtoField[] FieldsOf(string messageType)
        {
            ProtoField[] fields;
            if (!Messages.TryGetValue(messageType, out fields))
                throw new ArgumentException("no message " + messageType + " in the xlm.v1 schema");
            return fields;
        }

        // -- encoding ------------------------------------------------------------------------------

        static void WriteMessage(Stream output, string messageType, JsonObject json)
        {
            var fields = FieldsOf(messageType);
            foreach (var pair in json)
            {
                var field = Array.Find(fields, f => f.JsonName == pair.Key);
                if (field == null)
                    throw new ArgumentException(messageType + " has no field '" + pair.Key + "'");
                if (pair.Value == null)
                    continue;
                if (field.Map)
                    WriteMap(output, field, pair.Value as JsonObject);
                else if (field.Repeated)
                    WriteRepeated(output, field, pair.Value as List<object>);
                else if (field.Presence || !IsDefault(field, pair.Value))
                    WriteField(output, field, pair.Value);
            }
        }

        static void WriteMap(Stream output, ProtoField field, JsonObject map)
        {
            if (map == null)
                throw new ArgumentException(field.JsonName + " must be a JSON object");
            foreach (var entry in map)
            {
                var body = new MemoryStream();
                WriteMessage(body, field.TypeName, new JsonObject { { "key", entry.Key }, { "value", entry.Value } });
                WriteTag(output, field.Number, WireLength);
                WriteBytes(output, body.ToArray());
            }
        }

        static void WriteRepeated(Stream output, ProtoField field, List<object> items)
        {
            if (items == null)
                throw new ArgumentException(field.JsonName + " must be a JSON array");
            if (field.Type == ProtoType.String || field.Type == ProtoType.Bytes || field.Type == ProtoType.Message)
            {
                foreach (var item in items)
                    WriteField(output, field, item);
                return;
            }
            // Proto3 packs repeated numbers into one length-delimited field.
            var packed = new MemoryStream();
            foreach (var item in items)
                WriteScalar(packed, field, item);
            WriteTag(output, field.Number, WireLength);
            WriteBytes(output, packed.ToArray());
        }

        static void WriteField(Stream output, ProtoField field, object value)
        {
            switch (field.Type)
            {
                case ProtoType.String:
                    WriteTag(output, field.Number, WireLength);
                    WriteBytes(output, Encoding.UTF8.GetBytes(Convert.ToString(value, CultureInfo.InvariantCulture)));
                    break;
                case ProtoType.Bytes:
                    WriteTag(output, field.Number, WireLength);
                    WriteBytes(output, value as byte[] ?? Convert.FromBase64String((string)value));
                    break;
                case ProtoType.Message:
                    var body = new MemoryStream();
                    var nested = value as JsonObject;
                    if (nested == null)
                        throw new ArgumentException(field.JsonName + " must be a JSON object");
                    WriteMessage(body, field.TypeName, nested);
                    WriteTag(output, field.Number, WireLength);
                    WriteBytes(output, body.ToArray());
                    break;
                case ProtoType.Double:
                    WriteTag(output, field.Number, WireFixed64);
                    WriteScalar(output, field, value);
                    break;
                case ProtoType.Float:
                    WriteTag(output, field.Number, WireFixed32);
                    WriteScalar(output, field, value);
                    break;
                default:
                    WriteTag(output, field.Number, WireVarint);
                    WriteScalar(output, field, value);
                    break;
            }
        }

        static void WriteScalar(Stream output, ProtoField field, object value)
        {
            switch (field.Type)
            {
                case ProtoType.Double:
                    WriteLittleEndian(output, (ulong)BitConverter.DoubleToInt64Bits(Number(value)), 8);
                    break;
                case ProtoType.Float:
                    WriteLittleEndian(output, (uint)BitConverter.ToInt32(BitConverter.GetBytes((float)Number(value)), 0), 4);
                    break;
                case ProtoType.Int64:
                    WriteVarint(output, (ulong)long.Parse(Integer(value), CultureInfo.InvariantCulture));
                    break;
                case ProtoType.UInt64:
                    WriteVarint(output, ulong.Parse(Integer(value), CultureInfo.InvariantCulture));
                    break;
                case ProtoType.Int32:
                    WriteVarint(output, (ulong)(long)checked((int)Number(value))); // negatives take ten bytes, as protobuf says
                    break;
                case ProtoType.UInt32:
                    WriteVarint(output, checked((uint)Number(value)));
                    break;
                case ProtoType.Bool:
                    WriteVarint(output, (bool)value ? 1UL : 0UL);
                    break;
                case ProtoType.Enum:
                    WriteVarint(output, (ulong)(long)EnumNumber(field, value));
                    break;
                default:
                    throw new ArgumentException(field.JsonName + ": not a scalar");
            }
        }

        static bool IsDefault(ProtoField field, object value)
        {
            switch (field.Type)
            {
                case ProtoType.String: return (string)value == "";
                case ProtoType.Bytes: return value is byte[] ? ((byte[])value).Length == 0 : (string)value == "";
                case ProtoType.Bool: return !(bool)value;
                case ProtoType.Message: return false;
                case ProtoType.Enum: return EnumNumber(field, value) == 0;
                case ProtoType.Int64:
                case ProtoType.UInt64: return Integer(value) == "0";
                default: return Number(value) == 0;
            }
        }

        static double Number(object value)
        {
            if (value is double) return (double)value;
            var text = value as string;
            if (text != null) return double.Parse(text, NumberStyles.Float, CultureInfo.InvariantCulture);
            return Convert.ToDouble(value, CultureInfo.InvariantCulture);
        }

        /// <summary>64-bit integers come as strings in the mapping (or as any .NET integer from this client).</summary>
        static string Integer(object value)
        {
            var text = value as string;
            return text ?? Convert.ToString(value is double ? (object)(decimal)(double)value : value, CultureInfo.InvariantCulture);
        }

        static int EnumNumber(ProtoField field, object value)
        {
            var name = value as string;
            if (name == null)
                return (int)Number(value);
            var index = Array.IndexOf(Enums[field.TypeName], name);
            if (index < 0)
                throw new ArgumentException(field.JsonName + ": " + name + " is not a " + field.TypeName);
            return index;
        }

        static void WriteTag(Stream output, int number, int wireType)
        {
            WriteVarint(output, (ulong)((number << 3) | wireType));
        }

        static void WriteBytes(Stream output, byte[] bytes)
        {
            WriteVarint(output, (ulong)bytes.Length);
            output.Write(bytes, 0, bytes.Length);
        }

        static void WriteVarint(Stream output, ulong value)
        {
            while (value >= 0x80)
            {
                output.WriteByte((byte)(value | 0x80));
                value >>= 7;
            }
            output.WriteByte((byte)value);
        }

        static void WriteLittleEndian(Stream output, ulong value, int bytes)
        {
            for (var i = 0; i < bytes; i++)
                output.WriteByte((byte)(value >> (8 * i)));
        }

        // -- decoding ------------------------------------------------------------------------------

        static JsonObject ReadMessage(string messageType, byte[] data, int pos, int end, int depth)
        {
            if (depth > Json.MaxDepth)
                throw new FormatException("protobuf message nests too deep");
            var fields = FieldsOf(messageType);
            var json = new JsonObject();
            foreach (var f in fields)
            {
                // Defaults first, as the bridge's JSON has them; messages and optionals stay absent.
                if (f.Map) json[f.JsonName] = new JsonObject();
                else if (f.Repeated) json[f.JsonName] = new List<object>();
                else if (!f.Presence && f.Type != ProtoType.Message) json[f.JsonName] = DefaultOf(f);
            }
            while (pos < end)
            {
                var tag = ReadVarint(data, ref pos, end);
                var number = (int)(tag >> 3);
                var wire = (int)(tag & 7);
                var field = Array.Find(fields, f => f.Number == number);
                if (field == null)
                {
                    Skip(data, ref pos, end, wire);
                    continue;
                }
                if (field.Map)
                {
                    var length = checked((int)ReadVarint(data, ref pos, end));
                    var entry = ReadMessage(field.TypeName, data, pos, Bounded(pos, length, end), depth + 1);
                    pos += length;
                    ((JsonObject)json[field.JsonName])[MapKey(entry["key"])] = entry["value"];
                }
                else if (field.Repeated)
                {
                    var list = (List<object>)json[field.JsonName];
                    var packable = field.Type != ProtoType.String && field.Type != ProtoType.Bytes && field.Type != ProtoType.Message;
                    if (packable && wire == WireLength)
                    {
                        var length = checked((int)ReadVarint(data, ref pos, end));
                        var stop = Bounded(pos, length, end);
                        while (pos < stop)
                            list.Add(ReadValue(field, WireOf(field), data, ref pos, stop, depth));
                    }
                    else
                    {
                        list.Add(ReadValue(field, wire, data, ref pos, end, depth));
                    }
                }
                else
                {
                    json[field.JsonName] = ReadValue(field, wire, data, ref pos, end, depth);
                }
            }
            return json;
        }

        static object ReadValue(ProtoField field, int wire, byte[] data, ref int pos, int end, int depth)
        {
            if (wire != WireOf(field))
                throw new FormatException(field.JsonName + ": wire type " + wire + " where " + WireOf(field) + " belongs");
            switch (field.Type)
            {
                case ProtoType.Double:
                    return BitConverter.Int64BitsToDouble((long)ReadLittleEndian(data, ref pos, end, 8));
                case ProtoType.Float:
                    return (double)BitConverter.ToSingle(BitConverter.GetBytes((uint)ReadLittleEndian(data, ref pos, end, 4)), 0);
                case ProtoType.Int64:
                    return ((long)ReadVarint(data, ref pos, end)).ToString(CultureInfo.InvariantCulture);
                case ProtoType.UInt64:
                    return ReadVarint(data, ref pos, end).ToString(CultureInfo.InvariantCulture);
                case ProtoType.Int32:
                    return (double)(int)(long)ReadVarint(data, ref pos, end);
                case ProtoType.UInt32:
                    return (double)(uint)ReadVarint(data, ref pos, end);
                case ProtoType.Bool:
                    return ReadVarint(data, ref pos, end) != 0;
                case ProtoType.Enum:
                    var number = (int)(long)ReadVarint(data, ref pos, end);
                    var names = Enums[field.TypeName];
                    return number >= 0 && number < names.Length ? (object)names[number] : (double)number;
                default:
                    var length = checked((int)ReadVarint(data, ref pos, end));
                    var stop = Bounded(pos, length, end);
                    object value;
                    if (field.Type == ProtoType.String)
                        value = Encoding.UTF8.GetString(data, pos, length);
                    else if (field.Type == ProtoType.Bytes)
                        value = Convert.ToBase64String(data, pos, length);
                    else
                        value = ReadMessage(field.TypeName, data, pos, stop, depth + 1);
                    pos = stop;
                    return value;
            }
        }

        /// <summary>A map key as the JSON mapping writes it: text, integers in decimal (token ids).</summary>
        static string MapKey(object key)
        {
            if (key is double)
                return ((long)(double)key).ToString(CultureInfo.InvariantCulture);
            if (key is bool)
                return (bool)key ? "true" : "false";
            return (string)key;
        }

        static object DefaultOf(ProtoField field)
        {
            switch (field.Type)
            {
                case ProtoType.String:
                case ProtoType.Bytes: return "";
                case ProtoType.Bool: return false;
                case ProtoType.Int64:
                case ProtoType.UInt64: return "0";
                case ProtoType.Enum: return Enums[field.TypeName][0];
                default: return 0.0;
            }
        }

        static int WireOf(ProtoField field)
        {
            switch (field.Type)
            {
                case ProtoType.Double: return WireFixed64;
                case ProtoType.Float: return WireFixed32;
                case ProtoType.String:
                case ProtoType.Bytes:
                case ProtoType.Message: return WireLength;
                default: return WireVarint;
            }
        }

        static int Bounded(int pos, int length, int end)
        {
            if (length < 0 || length > end - pos)
                throw new FormatException("protobuf field runs past the end of its message");
            return pos + length;
        }

        static void Skip(byte[] data, ref int pos, int end, int wire)
        {
            switch (wire)
            {
                case WireVarint: ReadVarint(data, ref pos, end); break;
                case WireFixed64: pos = Bounded(pos, 8, end); break;
                case WireFixed32: pos = Bounded(pos, 4, end); break;
                case WireLength: var length = checked((int)ReadVarint(data, ref pos, end)); pos = Bounded(pos, length, end); break;
                default: throw new FormatException("unknown protobuf wire type " + wire);
            }
        }

        static ulong ReadVarint(byte[] data, ref int pos, int end)
        {
            ulong value = 0;
            for (var shift = 0; shift < 64; shift += 7)
            {
                if (pos >= end)
                    throw new FormatException("protobuf varint runs past the end of its message");
                var b = data[pos++];
                value |= (ulong)(b & 0x7f) << shift;
                if (b < 0x80)
                    return value;
            }
            throw new FormatException("protobuf varint longer than ten bytes");
        }

        static ulong ReadLittleEndian(byte[] data, ref int pos, int end, int bytes)
        {
            Bounded(pos, bytes, end);
            ulong value = 0;
            for (var i = 0; i < bytes; i++)
                value |= (ulong)data[pos++] << (8 * i);
            return value;
        }
    }
}
