using System;
using System.Collections.Generic;
using System.Text;

namespace Xlm.Sidecar
{
    // Token log probabilities (GenerateRequest.Logprobs; GenerateChunk.logprobs in the proto): how
    // sure the model was of each token it wrote, and what else it might have written there. A game
    // reads them to score candidate lines, to flag a hesitant answer, or to offer alternatives.

    /// <summary>A token the model could have written at a position, with its log probability.</summary>
    public class TokenAlternative
    {
        public int TokenId;
        /// <summary>The token's bytes: a token may hold only part of a UTF-8 character.</summary>
        public byte[] Piece;
        /// <summary>Natural log of its probability under the model (before temperature, penalties or
        /// biases): 0 is certain, -0.7 about even odds, -4.6 one in a hundred.</summary>
        public float Logprob;

        /// <summary>Piece as text (a partial character shows as U+FFFD).</summary>
        public string PieceText { get { return Encoding.UTF8.GetString(Piece ?? new byte[0]); } }

        /// <summary>exp(Logprob): the probability, 0 to 1.</summary>
        public double Probability { get { return Math.Exp(Logprob); } }

        internal static byte[] ReadPiece(JsonObject json)
        {
            // bytes fields are base64 in the JSON mapping.
            var text = json.GetString("piece");
            try
            {
                return Convert.FromBase64String(text);
            }
            catch (FormatException e)
            {
                throw new FormatException("a token's piece is not base64: " + text, e);
            }
        }

        internal static TokenAlternative FromJson(JsonObject json)
        {
            return new TokenAlternative
            {
                TokenId = json.GetInt32("tokenId"),
                Piece = ReadPiece(json),
                Logprob = (float)json.GetDouble("logprob"),
            };
        }
    }

    /// <summary>One generated token: its id, bytes and log probability, and the likeliest tokens at
    /// its position (as many as GenerateRequest.Logprobs asked for, likeliest first).</summary>
    public sealed class TokenLogprob : TokenAlternative
    {
        public TokenAlternative[] Top;

        internal static new TokenLogprob FromJson(JsonObject json)
        {
            var top = json.GetArray("top");
            var alternatives = new TokenAlternative[top.Count];
            for (var i = 0; i < top.Count; i++)
                alternatives[i] = TokenAlternative.FromJson(top[i] as JsonObject ?? new JsonObject());
            return new TokenLogprob
            {
                TokenId = json.GetInt32("tokenId"),
                Piece = ReadPiece(json),
                Logprob = (float)json.GetDouble("logprob"),
                Top = alternatives,
            };
        }

        internal static TokenLogprob[] ListFromJson(List<object> list)
        {
            var entries = new TokenLogprob[list.Count];
            for (var i = 0; i < list.Count; i++)
                entries[i] = FromJson(list[i] as JsonObject ?? new JsonObject());
            return entries;
        }

        /// <summary>The log probability of a whole reply: the sum over its tokens (higher is likelier;
        /// divide by the count to compare replies of different lengths).</summary>
        public static double Sum(IEnumerable<TokenLogprob> tokens)
        {
            var sum = 0.0;
            foreach (var t in tokens)
                sum += t.Logprob;
            return sum;
        }
    }
}
