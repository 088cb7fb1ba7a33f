using System;
using System.Collections.Generic;

namespace Xlm.Sidecar
{
    // The requests of xlm.v1 (proto/xlm/v1/sidecar.proto), each with its protobuf JSON mapping:
    // lowerCamelCase names, 64-bit integers as strings, bytes as base64, unset optionals left out.

    public sealed class ChatMessage
    {
        /// <summary>"system", "user" or "assistant".</summary>
        public string Role;
        public string Content;

        public ChatMessage(string role, string content)
        {
            Role = role;
            Content = content;
        }

        public static ChatMessage System(string content) { return new ChatMessage("system", content); }
        public static ChatMessage User(string content) { return new ChatMessage("user", content); }
        public static ChatMessage Assistant(string content) { return new ChatMessage("assistant", content); }

        internal JsonObject ToJson()
        {
            return new JsonObject { { "role", Role ?? "" }, { "content", Content ?? "" } };
        }
    }

    /// <summary>Sampling settings; a null field takes the daemon's default.</summary>
    public sealed class SamplingParams
    {
        /// <summary>0 is greedy. Daemon default 0.7.</summary>
        public float? Temperature;
        public int? TopK;
        public float? TopP;
        public float? MinP;
        public float? RepeatPenalty;
        public int? RepeatLastN;
        /// <summary>Fixed seed for reproducible sampling; null is a random seed per request.</summary>
        public ulong? Seed;
        /// <summary>Added to a token's logit before sampling: token id (TokenizeAsync finds them) to a
        /// bias from -100 to 100. At -100 the token is banned; +5 makes it much likelier. At most 1024.</summary>
        public Dictionary<int, float> LogitBias;

        /// <summary>Never sample `tokenId` (a bias of -100).</summary>
        public SamplingParams Ban(int tokenId)
        {
            return Bias(tokenId, -100f);
        }

        /// <summary>Add `bias` (-100 to 100) to `tokenId`'s logit.</summary>
        public SamplingParams Bias(int tokenId, float bias)
        {
            if (LogitBias == null)
                LogitBias = new Dictionary<int, float>();
            LogitBias[tokenId] = bias;
            return this;
        }

        internal JsonObject ToJson()
        {
            var json = new JsonObject();
            if (Temperature.HasValue) json["temperature"] = (double)Temperature.Value;
            if (TopK.HasValue) json["topK"] = TopK.Value;
            if (TopP.HasValue) json["topP"] = (double)TopP.Value;
            if (MinP.HasValue) json["minP"] = (double)MinP.Value;
            if (RepeatPenalty.HasValue) json["repeatPenalty"] = (double)RepeatPenalty.Value;
            if (RepeatLastN.HasValue) json["repeatLastN"] = RepeatLastN.Value;
            if (Seed.HasValue) json["seed"] = Seed.Value.ToString(System.Globalization.CultureInfo.InvariantCulture);
            if (LogitBias != null && LogitBias.Count > 0)
            {
                // A map in the JSON mapping: an object whose keys are the token ids as text.
                var biases = new JsonObject();
                foreach (var entry in LogitBias)
                    biases[entry.Key.ToString(System.Globalization.CultureInfo.InvariantCulture)] = (double)entry.Value;
                json["logitBias"] = biases;
            }
            return json;
        }
    }

    /// <summary>Chat messages (templated by the model) or a raw prompt: set exactly one.</summary>
    public sealed class GenerateRequest
    {
        /// <summary>With a session: only this turn's new messages; the daemon keeps the rest.</summary>
        public List<ChatMessage> Messages;
        public string Prompt;
        public SamplingParams Sampling;
        /// <summary>0 is the daemon's default (256).</summary>
        public uint MaxTokens;
        public List<string> Stop;
        /// <summary>A JSON schema the reply must validate against (structured NPC actions).</summary>
        public string JsonSchema;
        /// <summary>One id per NPC keeps its conversation (and KV cache) between calls.</summary>
        public string SessionId;
        /// <summary>With a session: forget its history before this turn.</summary>
        public bool ResetSession;
        /// <summary>Echoed in the daemon's logs.</summary>
        public string RequestId;
        /// <summary>Shared world context (lore, rules, quest state) that opens the prompt before the
        /// NPC's persona. Give every NPC the very same text and the daemon computes it once for all
        /// of them. With a session it counts on the first turn only.</summary>
        public string Context;
        /// <summary>Functions the NPC may call (its actions), with Messages only: the reply is then a
        /// call of one of them (GenerationResult.ToolCall, FinishReason.ToolCall). See Tools.cs.</summary>
        public List<ToolDefinition> Tools;
        /// <summary>With Tools: Required (the daemon's default), Auto, None or Function(name).</summary>
        public ToolChoice ToolChoice;
        /// <summary>Return each generated token's log probability (GenerationResult.Logprobs) with this
        /// many of the likeliest alternatives at its position (0 to 20). Null: none.</summary>
        public uint? Logprobs;
        /// <summary>A GBNF grammar (llama.cpp's format, with a `root` rule) the reply is held to, e.g.
        /// <c>root ::= "Aye" | "Nay"</c>. Not with JsonSchema or Tools.</summary>
        public string Grammar;
        /// <summary>With a session: what it remembers and recalls (null: the session's own scope and the
        /// daemon's defaults; the last options a session was given hold for its later turns).</summary>
        public MemoryOptions Memory;

        internal JsonObject ToJson()
        {
            var hasMessages = Messages != null && Messages.Count > 0;
            if (hasMessages == (Prompt != null))
                throw new ArgumentException("a GenerateRequest needs either Messages or Prompt, not both and not neither");
            var json = new JsonObject();
            if (hasMessages)
            {
                var list = new List<object>();
                foreach (var m in Messages)
                    list.Add(m.ToJson());
                json["messages"] = new JsonObject { { "messages", list } };
            }
            else
            {
                json["prompt"] = Prompt;
            }
            AddCommon(json, Sampling, MaxTokens, Stop, JsonSchema, SessionId, RequestId);
            if (ResetSession) json["resetSession"] = true;
            if (!string.IsNullOrEmpty(Context)) json["context"] = Context;
            if (Tools != null && Tools.Count > 0) json["tools"] = ToolDefinition.ListToJson(Tools);
            if (ToolChoice != null) json["toolChoice"] = ToolChoice.Value;
            if (Logprobs.HasValue) json["logprobs"] = Logprobs.Value;
            if (!string.IsNullOrEmpty(Grammar)) json["grammar"] = Grammar;
            if (Memory != null) json["memory"] = Memory.ToJson();
            return json;
        }

        internal static void AddCommon(JsonObject json, SamplingParams sampling, uint maxTokens, List<string> stop,
            string jsonSchema, string sessionId, string requestId)
        {
            if (sampling != null) json["sampling"] = sampling.ToJson();
            if (maxTokens != 0) json["maxTokens"] = maxTokens;
            if (stop != null && stop.Count > 0) json["stop"] = new List<object>(stop);
            if (!string.IsNullOrEmpty(jsonSchema)) json["jsonSchema"] = jsonSchema;
            if (!string.IsNullOrEmpty(sessionId)) json["sessionId"] = sessionId;
            if (!string.IsNullOrEmpty(requestId)) json["requestId"] = requestId;
        }
    }

    public enum PixelFormat
    {
        Unspecified = 0,
        Rgba8 = 1,
        Bgra8 = 2,
        Rgb8 = 3,
    }

    /// <summary>Pixels as an engine reads them back (Unity: RGBA8, bottom row first).</summary>
    public sealed class RawImage
    {
        public byte[] Pixels;
        public uint Width;
        public uint Height;
        /// <summary>Bytes from one row to the next; 0 is tightly packed.</summary>
        public uint Stride;
        public PixelFormat Format = PixelFormat.Rgba8;
        /// <summary>True for Unity's ReadPixels, GetPixels32 and GetRawTextureData.</summary>
        public bool BottomUp;

        internal JsonObject ToJson()
        {
            var json = new JsonObject
            {
                { "pixels", Pixels ?? new byte[0] },
                { "width", Width },
                { "height", Height },
                { "format", FormatName(Format) },
            };
            if (Stride != 0) json["stride"] = Stride;
            if (BottomUp) json["bottomUp"] = true;
            return json;
        }

        static string FormatName(PixelFormat format)
        {
            switch (format)
            {
                case PixelFormat.Rgba8: return "PIXEL_FORMAT_RGBA8";
                case PixelFormat.Bgra8: return "PIXEL_FORMAT_BGRA8";
                case PixelFormat.Rgb8: return "PIXEL_FORMAT_RGB8";
                default: return "PIXEL_FORMAT_UNSPECIFIED";
            }
        }
    }

    /// <summary>An image: encoded file bytes (PNG/JPEG) or raw pixels.</summary>
    public sealed class ImageInput
    {
        public byte[] Encoded;
        public RawImage Raw;

        public static ImageInput FromEncoded(byte[] pngOrJpeg) { return new ImageInput { Encoded = pngOrJpeg }; }
        public static ImageInput FromRaw(RawImage raw) { return new ImageInput { Raw = raw }; }

        internal JsonObject ToJson()
        {
            if ((Encoded != null) == (Raw != null))
                throw new ArgumentException("an ImageInput needs either Encoded or Raw, not both and not neither");
            return Encoded != null
                ? new JsonObject { { "encoded", Encoded } }
                : new JsonObject { { "raw", Raw.ToJson() } };
        }
    }

    public sealed class AskImageRequest
    {
        /// <summary>Null for a follow-up question in a session that already saw an image.</summary>
        public ImageInput Image;
        public string Question;
        public SamplingParams Sampling;
        public uint MaxTokens;
        public List<string> Stop;
        public string JsonSchema;
        public string SessionId;
        public string RequestId;

        internal JsonObject ToJson()
        {
            var json = new JsonObject { { "question", Question ?? "" } };
            if (Image != null) json["image"] = Image.ToJson();
            GenerateRequest.AddCommon(json, Sampling, MaxTokens, Stop, JsonSchema, SessionId, RequestId);
            return json;
        }
    }

    /// <summary>What the game grants the daemon: set one VRAM form (or none) and optionally a thread cap.</summary>
    public sealed class SetBudgetRequest
    {
        public ulong? VramBytes;
        /// <summary>As people write it: "512M", "3G", "2.5G", "0" (CPU only).</summary>
        public string VramSize;
        /// <summary>Follow the GPU's free memory, keeping this many bytes for the game.</summary>
        public ulong? AutoReserveBytes;
        /// <summary>Null keeps the current cap; 0 removes it.</summary>
        public uint? MaxCpuThreads;
        /// <summary>Host memory the daemon may hold, written like VramSize ("512M", "2G"); null keeps
        /// the current one, "0" removes it. INVALID_ARGUMENT below what the model itself needs.</summary>
        public string RamSize;

        public static SetBudgetRequest Vram(string size, uint? maxCpuThreads = null, string ramSize = null)
        {
            return new SetBudgetRequest { VramSize = size, MaxCpuThreads = maxCpuThreads, RamSize = ramSize };
        }

        /// <summary>Only the host memory budget; VRAM and the thread cap stay as they are.</summary>
        public static SetBudgetRequest Ram(string size)
        {
            return new SetBudgetRequest { RamSize = size };
        }

        public static SetBudgetRequest FollowFreeVram(ulong reserveBytes, uint? maxCpuThreads = null)
        {
            return new SetBudgetRequest { AutoReserveBytes = reserveBytes, MaxCpuThreads = maxCpuThreads };
        }

        internal JsonObject ToJson()
        {
            var forms = (VramBytes.HasValue ? 1 : 0) + (VramSize != null ? 1 : 0) + (AutoReserveBytes.HasValue ? 1 : 0);
            if (forms > 1)
                throw new ArgumentException("set at most one of VramBytes, VramSize and AutoReserveBytes");
            var json = new JsonObject();
            if (VramBytes.HasValue) json["vramBytes"] = VramBytes.Value.ToString(System.Globalization.CultureInfo.InvariantCulture);
            if (VramSize != null) json["vramSize"] = VramSize;
            if (AutoReserveBytes.HasValue) json["autoReserveBytes"] = AutoReserveBytes.Value.ToString(System.Globalization.CultureInfo.InvariantCulture);
            if (MaxCpuThreads.HasValue) json["maxCpuThreads"] = MaxCpuThreads.Value;
            if (RamSize != null) json["ramSize"] = RamSize;
            return json;
        }
    }
}
