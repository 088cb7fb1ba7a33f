using System.Collections.Generic;

namespace Xlm.Sidecar
{
    // What Generate and AskImage stream back, read from protobuf's JSON mapping.

    public enum FinishReason
    {
        Unspecified = 0,
        /// <summary>The model ended its reply.</summary>
        Stop = 1,
        /// <summary>MaxTokens reached.</summary>
        Length = 2,
        /// <summary>One of the request's stop strings appeared.</summary>
        StopString = 3,
        /// <summary>The client cancelled, or the daemon is shutting down.</summary>
        Cancelled = 4,
        /// <summary>The session's context is full.</summary>
        ContextFull = 5,
        /// <summary>The reply is a call of one of the request's tools.</summary>
        ToolCall = 6,
    }

    public sealed class Usage
    {
        /// <summary>Prompt tokens of this call, including those reused from the session's cache.</summary>
        public uint PromptTokens;
        /// <summary>Of PromptTokens, how many were already cached and not computed again.</summary>
        public uint CachedPromptTokens;
        public uint CompletionTokens;

        internal static Usage FromJson(JsonObject json)
        {
            json = json ?? new JsonObject();
            return new Usage
            {
                PromptTokens = json.GetUInt32("promptTokens"),
                CachedPromptTokens = json.GetUInt32("cachedPromptTokens"),
                CompletionTokens = json.GetUInt32("completionTokens"),
            };
        }
    }

    public sealed class Timings
    {
        public double TimeToFirstTokenMs;
        public double PrefillTokensPerS;
        /// <summary>Generated tokens per second, first token excluded.</summary>
        public double DecodeTokensPerS;
        public double TotalMs;
        public double QueuedMs;

        internal static Timings FromJson(JsonObject json)
        {
            json = json ?? new JsonObject();
            return new Timings
            {
                TimeToFirstTokenMs = json.GetDouble("timeToFirstTokenMs"),
                PrefillTokensPerS = json.GetDouble("prefillTokensPerS"),
                DecodeTokensPerS = json.GetDouble("decodeTokensPerS"),
                TotalMs = json.GetDouble("totalMs"),
                QueuedMs = json.GetDouble("queuedMs"),
            };
        }
    }

    /// <summary>What was done to an image before the model saw it.</summary>
    public sealed class ImageInfo
    {
        public uint OriginalWidth;
        public uint OriginalHeight;
        public uint EncodedWidth;
        public uint EncodedHeight;
        /// <summary>True when the VRAM budget forced a smaller image than the projector's best.</summary>
        public bool Downscaled;
        public uint ImageTokens;
        public double EncodeMs;

        internal static ImageInfo FromJson(JsonObject json)
        {
            if (json == null)
                return null;
            return new ImageInfo
            {
                OriginalWidth = json.GetUInt32("originalWidth"),
                OriginalHeight = json.GetUInt32("originalHeight"),
                EncodedWidth = json.GetUInt32("encodedWidth"),
                EncodedHeight = json.GetUInt32("encodedHeight"),
                Downscaled = json.GetBool("downscaled"),
                ImageTokens = json.GetUInt32("imageTokens"),
                EncodeMs = json.GetDouble("encodeMs"),
            };
        }
    }

    /// <summary>The last chunk's summary of a reply.</summary>
    public sealed class GenerationFinal
    {
        public FinishReason FinishReason;
        public Usage Usage;
        public Timings Timings;
        /// <summary>The session this turn belongs to; empty for one-off requests.</summary>
        public string SessionId;
        /// <summary>Set for AskImage.</summary>
        public ImageInfo Image;
        /// <summary>The call the reply made, with FinishReason.ToolCall; null otherwise.</summary>
        public ToolCall ToolCall;
        /// <summary>Sessions with memory: the memories told to the model this turn.</summary>
        public List<ulong> MemoriesUsed;
        /// <summary>Sessions with memory: what the turns that left the context became (the "context full" signal).</summary>
        public List<ulong> MemoriesAdded;

        internal static GenerationFinal FromJson(JsonObject json)
        {
            if (json == null)
                return null;
            return new GenerationFinal
            {
                FinishReason = ParseFinishReason(json.GetString("finishReason")),
                Usage = Usage.FromJson(json.GetObject("usage")),
                Timings = Timings.FromJson(json.GetObject("timings")),
                SessionId = json.GetString("sessionId"),
                Image = ImageInfo.FromJson(json.GetObject("image")),
                ToolCall = ToolCall.FromJson(json.GetObject("toolCall")),
                MemoriesUsed = Ids(json.GetArray("memoriesUsed")),
                MemoriesAdded = Ids(json.GetArray("memoriesAdded")),
            };
        }

        static List<ulong> Ids(List<object> items)
        {
            var ids = new List<ulong>();
            if (items != null)
                foreach (var item in items)
                    ids.Add(System.Convert.ToUInt64(item, System.Globalization.CultureInfo.InvariantCulture));
            return ids;
        }

        static FinishReason ParseFinishReason(string name)
        {
            switch (name)
            {
                case "FINISH_REASON_STOP": return FinishReason.Stop;
                case "FINISH_REASON_LENGTH": return FinishReason.Length;
                case "FINISH_REASON_STOP_STRING": return FinishReason.StopString;
                case "FINISH_REASON_CANCELLED": return FinishReason.Cancelled;
                case "FINISH_REASON_CONTEXT_FULL": return FinishReason.ContextFull;
                case "FINISH_REASON_TOOL_CALL": return FinishReason.ToolCall;
                default: return FinishReason.Unspecified;
            }
        }
    }

    /// <summary>One piece of a streamed reply.</summary>
    public sealed class GenerateChunk
    {
        /// <summary>New text since the previous chunk; always whole UTF-8 characters.</summary>
        public string Text;
        public int[] TokenIds;
        /// <summary>Present on the last chunk only (of each candidate, for CandidatesAsync).</summary>
        public GenerationFinal Final;
        /// <summary>With GenerateRequest.Logprobs: one per token of TokenIds, in order; else empty.</summary>
        public TokenLogprob[] Logprobs;
        /// <summary>Which candidate this chunk belongs to (CandidatesAsync); 0 otherwise.</summary>
        public int Index;

        internal static GenerateChunk FromJson(JsonObject json)
        {
            var ids = json.GetArray("tokenIds");
            var tokenIds = new int[ids.Count];
            for (var i = 0; i < ids.Count; i++)
                tokenIds[i] = ids[i] is double ? (int)(double)ids[i] : 0;
            return new GenerateChunk
            {
                Text = json.GetString("text"),
                TokenIds = tokenIds,
                Final = GenerationFinal.FromJson(json.GetObject("final")),
                Logprobs = TokenLogprob.ListFromJson(json.GetArray("logprobs")),
                Index = json.GetInt32("index"),
            };
        }
    }

    /// <summary>A whole reply: the text of every chunk and the final summary.</summary>
    public sealed class GenerationResult
    {
        public string Text;
        /// <summary>Null only when the stream ended without a final chunk (the daemon never does that).</summary>
        public GenerationFinal Final;
        public int Chunks;
        public int Tokens;
        /// <summary>The reply's tokens, in order (TokenizeAsync's ids: ban or favour them next time).</summary>
        public List<int> TokenIds = new List<int>();
        /// <summary>With GenerateRequest.Logprobs: each token's log probability and alternatives, one
        /// per entry of TokenIds; empty otherwise.</summary>
        public List<TokenLogprob> Logprobs = new List<TokenLogprob>();

        public FinishReason FinishReason { get { return Final != null ? Final.FinishReason : FinishReason.Unspecified; } }
        public Usage Usage { get { return Final != null ? Final.Usage : null; } }
        /// <summary>The tool the reply called (requests with Tools); null when it called none.</summary>
        public ToolCall ToolCall { get { return Final != null ? Final.ToolCall : null; } }

        /// <summary>Sum of the tokens' log probabilities (with Logprobs asked for): how likely the model
        /// found this reply; compare candidates by it divided by their token counts.</summary>
        public double TotalLogprob { get { return TokenLogprob.Sum(Logprobs); } }
    }

    /// <summary>Builds a GenerationResult from its chunks (one per candidate with CandidatesAsync).</summary>
    sealed class ReplyBuilder
    {
        readonly System.Text.StringBuilder text = new System.Text.StringBuilder();
        public readonly GenerationResult Result = new GenerationResult();

        public void Add(GenerateChunk chunk)
        {
            text.Append(chunk.Text);
            Result.Chunks++;
            Result.Tokens += chunk.TokenIds.Length;
            Result.TokenIds.AddRange(chunk.TokenIds);
            Result.Logprobs.AddRange(chunk.Logprobs);
            if (chunk.Final != null)
                Result.Final = chunk.Final;
        }

        public GenerationResult Finish()
        {
            Result.Text = text.ToString();
            return Result;
        }
    }
}
