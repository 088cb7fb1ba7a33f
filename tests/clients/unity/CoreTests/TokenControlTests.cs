using System;
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// Token controls: n candidates, log probabilities, logit biases, GBNF grammars, embeddings and
    /// tokenize/detokenize. The mapping offline; the rest against a live daemon on the tiny random
    /// llama over the transport under test, so these check mechanisms (counts, finals, indexes, unit
    /// vectors, round trips, refusals), never what the model says.
    /// </summary>
    public static class TokenControlTests
    {
        const string Persona = "You are Brann, the blacksmith of Oakvale. You speak in short, gruff sentences, you love your forge, " +
                               "and you distrust the mages of the tower. You sell swords, axes and horseshoes. ";
        const string AyeOrNay = "root ::= \"Aye\" | \"Nay\"";

        public static void Register()
        {
            TestRunner.Add("token_controls_map_to_protobuf_json", Mapping);
            TestRunner.Add("candidates_each_end_with_their_own_final", Candidates);
            TestRunner.Add("logprobs_come_with_each_token", Logprobs);
            TestRunner.Add("logit_bias_bans_and_favours_tokens", LogitBias);
            TestRunner.Add("a_gbnf_grammar_holds_the_reply", Grammar);
            TestRunner.Add("embeddings_are_unit_vectors_of_one_length", Embeddings);
            TestRunner.Add("tokenize_and_detokenize_round_trip", TokenizeRoundTrip);
        }

        static GenerateRequest Ask(string line, uint maxTokens, SamplingParams sampling)
        {
            return new GenerateRequest
            {
                Messages = new List<ChatMessage> { ChatMessage.System(Persona + Persona), ChatMessage.User(line) },
                MaxTokens = maxTokens,
                Sampling = sampling,
            };
        }

        static SamplingParams Greedy()
        {
            return new SamplingParams { Temperature = 0, RepeatPenalty = 1 };
        }

        static async Task<SidecarException> Refused(Func<Task> call, string what)
        {
            var e = await Check.Throws<SidecarException>(call, what);
            Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, what + ": " + e.Message);
            return e;
        }

        static Task Mapping()
        {
            var request = new GenerateRequest
            {
                Prompt = "x",
                Sampling = new SamplingParams { Temperature = 0 }.Ban(5).Bias(-3, 2.5f),
                Logprobs = 0,
                Grammar = AyeOrNay,
            }.ToJson();
            Check.Equal("{\"prompt\":\"x\",\"sampling\":{\"temperature\":0,\"logitBias\":{\"5\":-100,\"-3\":2.5}}," +
                        "\"logprobs\":0,\"grammar\":\"root ::= \\\"Aye\\\" | \\\"Nay\\\"\"}",
                Json.Write(request), "logit_bias as a map keyed by token id, logprobs 0 sent (0 alternatives is not 'none')");
            Check.True(!new GenerateRequest { Prompt = "x" }.ToJson().ContainsKey("logprobs"), "no logprobs unless asked");

            var chunk = GenerateChunk.FromJson(Json.ParseObject(
                "{\"text\":\"hi\",\"tokenIds\":[104,105],\"index\":2,\"logprobs\":[" +
                "{\"tokenId\":104,\"piece\":\"aA==\",\"logprob\":-0.5,\"top\":[{\"tokenId\":104,\"piece\":\"aA==\",\"logprob\":-0.5}," +
                "{\"tokenId\":72,\"piece\":\"SA==\",\"logprob\":-1.25}]}," +
                "{\"tokenId\":105,\"piece\":\"aQ==\",\"logprob\":-2,\"top\":[]}]}"));
            Check.Equal(2, chunk.Index, "the chunk's candidate");
            Check.Equal(2, chunk.Logprobs.Length, "one entry per token");
            Check.Equal("h", chunk.Logprobs[0].PieceText, "pieces are base64 bytes");
            Check.Equal(72, chunk.Logprobs[0].Top[1].TokenId, "alternatives in order");
            Check.Equal("H", chunk.Logprobs[0].Top[1].PieceText, "an alternative's piece");
            Check.True(Math.Abs(chunk.Logprobs[0].Probability - Math.Exp(-0.5)) < 1e-6, "probability is exp(logprob)");
            var builder = new ReplyBuilder();
            builder.Add(chunk);
            var result = builder.Finish();
            Check.Equal(-2.5, result.TotalLogprob, "a reply's log probability is its tokens' sum");
            Check.Equal(2, result.TokenIds.Count, "the reply keeps its token ids");

            Check.True(Math.Abs(SidecarClient.Similarity(new[] { 0.6f, 0.8f }, new[] { 0.6f, 0.8f }) - 1) < 1e-6, "a unit vector's similarity to itself");
            Check.True(Math.Abs(SidecarClient.Similarity(new[] { 1f, 0f }, new[] { 0f, 1f })) < 1e-9, "orthogonal vectors");
            using (var client = new SidecarClient(new WebSocketTransport("ws://127.0.0.1:9", "t"), null))
            {
                try
                {
                    client.CandidatesAsync(new GenerateRequest { Prompt = "x" }, 0);
                    throw new AssertionFailed("accepted 0 candidates");
                }
                catch (ArgumentOutOfRangeException)
                {
                }
            }
            return Task.FromResult(0);
        }

        static async Task Candidates()
        {
            using (var client = Env.Client(Env.Token))
            {
                var indexes = new HashSet<int>();
                var offMainThread = 0;
                var sampling = await NoEarlyEnd.Ban(client, new SamplingParams { Temperature = 1, Seed = 3 });
                var replies = await client.CandidatesAsync(Ask("What do you sell?", 6, sampling), 3, chunk =>
                {
                    indexes.Add(chunk.Index);
                    if (!MainThread.IsCurrent) offMainThread++;
                });
                Check.Equal(3, replies.Count, "one result per candidate");
                Check.True(indexes.SetEquals(new[] { 0, 1, 2 }), "chunks of every candidate, by index: " + string.Join(",", indexes));
                Check.Equal(0, offMainThread, "chunks delivered off the main thread");
                uint computed = 0;
                foreach (var reply in replies)
                {
                    Check.True(reply.Final != null, "every candidate ends with its own final chunk");
                    Check.True(reply.Usage.CompletionTokens > 0, "every candidate has tokens");
                    Check.Equal((int)reply.Usage.CompletionTokens, reply.Tokens, "a candidate's tokens are its own chunks'");
                    Check.Equal(reply.Tokens, reply.TokenIds.Count, "token ids kept");
                    Check.True(reply.Final.SessionId == "", "candidates are one-offs");
                    computed += reply.Usage.PromptTokens - reply.Usage.CachedPromptTokens;
                }
                var prompt = replies[0].Usage.PromptTokens;
                Check.True(computed <= prompt + (uint)replies.Count, "the prompt was computed once for all: " + computed + " of " + prompt);

                await Refused(() => client.CandidatesAsync(Ask("Hi", 2, null), 17), "17 candidates");
                var withSession = Ask("Hi", 2, null);
                withSession.SessionId = "brann-" + Guid.NewGuid().ToString("N");
                var e = await Refused(() => client.CandidatesAsync(withSession, 2), "candidates in a session");
                Check.True(e.Message.Contains("one-offs"), "the refusal says why: " + e.Message);
            }
        }

        static async Task Logprobs()
        {
            using (var client = Env.Client(Env.Token))
            {
                var request = Ask("What do you sell?", 8, await NoEarlyEnd.Ban(client, Greedy()));
                request.Logprobs = 2;
                var chunksAgree = true;
                var result = await client.GenerateAsync(request, chunk =>
                {
                    chunksAgree &= chunk.Logprobs.Length == chunk.TokenIds.Length;
                });
                Check.True(chunksAgree, "every chunk has one entry per token");
                Check.True(result.Tokens > 0, "tokens came");
                Check.Equal(result.Tokens, result.Logprobs.Count, "one log probability per token");
                for (var i = 0; i < result.Logprobs.Count; i++)
                {
                    var entry = result.Logprobs[i];
                    Check.Equal(result.TokenIds[i], entry.TokenId, "entry " + i + " is its token's");
                    Check.True(entry.Logprob <= 0 && !float.IsNaN(entry.Logprob), "a log probability: " + entry.Logprob);
                    Check.True(entry.Piece != null && entry.Piece.Length > 0, "a piece of bytes");
                    Check.Equal(2, entry.Top.Length, "as many alternatives as asked");
                    Check.True(entry.Top[0].Logprob >= entry.Top[1].Logprob, "likeliest first");
                    Check.True(entry.Top[0].Logprob >= entry.Logprob, "nothing likelier than the first alternative");
                }
                Check.True(result.TotalLogprob <= 0, "a reply's log probability");

                var none = await client.GenerateAsync(Ask("What do you sell?", 4, Greedy()));
                Check.Equal(0, none.Logprobs.Count, "none unless asked");
                var npc = new NpcConversation(client, "brann-" + Guid.NewGuid().ToString("N"), Persona) { MaxTokens = 4, Logprobs = 0 };
                var turn = await npc.SayAsync("Hello!");
                Check.Equal(turn.Tokens, turn.Logprobs.Count, "an NPC's turn with Logprobs 0");
                Check.True(turn.Logprobs.TrueForAll(t => t.Top.Length == 0), "0 alternatives");
                await npc.EndAsync();
                var over = Ask("Hi", 2, null);
                over.Logprobs = 21;
                await Refused(() => client.GenerateAsync(over), "21 alternatives");
            }
        }

        static async Task LogitBias()
        {
            using (var client = Env.Client(Env.Token))
            {
                var plain = await client.GenerateAsync(Ask("What do you sell?", 4, await NoEarlyEnd.Ban(client, Greedy())));
                var first = plain.TokenIds[0];
                var banned = await client.GenerateAsync(Ask("What do you sell?", 4, (await NoEarlyEnd.Ban(client, Greedy())).Ban(first)));
                Check.True(banned.Tokens > 0 && !banned.TokenIds.Contains(first), "a banned token (" + first + ") stays out");

                var tokens = await client.TokenizeAsync("x");
                Check.Equal(1, tokens.Length, "one token for x");
                var favoured = await client.GenerateAsync(Ask("What do you sell?", 5, Greedy().Bias(tokens[0], 100)));
                Check.True(favoured.Tokens > 0 && favoured.TokenIds.TrueForAll(t => t == tokens[0]),
                    "a bias of +100 makes every token the favoured one: " + string.Join(",", favoured.TokenIds));

                await Refused(() => client.GenerateAsync(Ask("Hi", 2, Greedy().Bias(first, 1000))), "a bias over 100");
                await Refused(() => client.GenerateAsync(Ask("Hi", 2, Greedy().Ban(100000000))), "an id outside the vocabulary");
            }
        }

        static async Task Grammar()
        {
            using (var client = Env.Client(Env.Token))
            {
                var npc = new NpcConversation(client, "brann-" + Guid.NewGuid().ToString("N"), Persona) { MaxTokens = 8, Sampling = Greedy() };
                var answer = await npc.SayInGrammarAsync("Will you mend my sword?", AyeOrNay);
                Check.True(answer.Text == "Aye" || answer.Text == "Nay", "the reply is in the grammar's language: " + answer.Text);
                Check.Equal(FinishReason.Stop, answer.FinishReason, "the grammar's end ends the reply");
                await npc.EndAsync();

                var unparsable = Ask("Hi", 4, null);
                unparsable.Grammar = "root ::= \"unterminated";
                var e = await Refused(() => client.GenerateAsync(unparsable), "a grammar llama.cpp cannot parse");
                Check.True(e.Message.Contains("could not be parsed"), "the refusal says so: " + e.Message);
                var both = Ask("Hi", 4, null);
                both.Grammar = AyeOrNay;
                both.JsonSchema = "{\"type\":\"object\"}";
                await Refused(() => client.GenerateAsync(both), "a grammar with a JSON schema");
                var after = await client.GenerateAsync(Ask("Hi", 2, Greedy()));
                Check.True(after.Final != null, "the daemon still answers");
            }
        }

        static async Task Embeddings()
        {
            using (var client = Env.Client(Env.Token))
            {
                var vectors = await client.EmbedAsync(new[] { "The smith sold a sword.", "The blacksmith sold me a blade.", "Rain over the sea." });
                Check.Equal(3, vectors.Length, "one embedding per text");
                Check.True(vectors[0].Length > 0, "an embedding has values");
                foreach (var v in vectors)
                {
                    Check.Equal(vectors[0].Length, v.Length, "embeddings of one length");
                    Check.True(Math.Abs(SidecarClient.Similarity(v, v) - 1) < 1e-3, "a unit vector: |v|^2 = " + SidecarClient.Similarity(v, v));
                }
                var again = await client.EmbedAsync(new List<string> { "Rain over the sea." });
                Check.True(SidecarClient.Similarity(again[0], vectors[2]) > 0.999, "the same text, the same embedding");
                await Refused(() => client.EmbedAsync(new string[0]), "nothing to embed");
                await Refused(() => client.EmbedAsync(new[] { new string('x', 20000) }), "a text over 512 tokens");
            }
        }

        static async Task TokenizeRoundTrip()
        {
            using (var client = Env.Client(Env.Token))
            {
                const string text = "Hello, traveller!";
                var tokens = await client.TokenizeAsync(text);
                Check.True(tokens.Length > 0, "tokens for a text");
                Check.Equal(text, await client.DetokenizeAsync(tokens), "detokenize gives the text back");
                var control = await client.TokenizeAsync("<|im_end|>", parseSpecial: true);
                var plain = await client.TokenizeAsync("<|im_end|>");
                Check.Equal(1, control.Length, "control-token text, parsed, is one token");
                Check.True(plain.Length > 1, "as plain text it is several: " + plain.Length);
                await Refused(() => client.DetokenizeAsync(new[] { 100000000 }), "an id outside the vocabulary");
            }
        }
    }
}
