using System;
using System.Collections.Generic;
using System.Threading.Tasks;

namespace Xlm.Sidecar.Tests
{
    /// <summary>
    /// NPC actions as function calls against a live daemon serving SmolLM2 (the tiny random llama
    /// would not end a call within a sane MaxTokens). pytest passes the tools' schemas in
    /// XLM_TEST_TOOL_SCHEMAS ({"name": {"description": ..., "parameters": {schema}}}) and validates
    /// each call this prints ("TOOL_CALL name arguments") against them with a JSON schema validator;
    /// the checks here are the ones a game would make.
    /// </summary>
    public static class ToolTests
    {
        public static void Register()
        {
            TestRunner.Add("tools_reply_with_a_call_of_a_declared_function", CallsADeclaredTool);
        }

        static List<ToolDefinition> DeclaredTools(out JsonObject schemas)
        {
            var declared = Json.ParseObject(Env.Get("XLM_TEST_TOOL_SCHEMAS"));
            schemas = new JsonObject();
            var tools = new List<ToolDefinition>();
            foreach (var entry in declared)
            {
                var spec = (JsonObject)entry.Value;
                var parameters = spec.GetObject("parameters");
                schemas[entry.Key] = parameters;
                tools.Add(new ToolDefinition(entry.Key, spec.GetString("description"), Json.Write(parameters)));
            }
            return tools;
        }

        /// <summary>The arguments hold the schema's required properties, no others, each from its enum.</summary>
        static void CheckArguments(ToolCall call, JsonObject schemas)
        {
            var schema = schemas.GetObject(call.Name);
            Check.True(schema != null, "the call names a declared tool: " + call.Name);
            var arguments = call.Arguments;
            var properties = schema.GetObject("properties") ?? new JsonObject();
            foreach (var required in schema.GetArray("required"))
                Check.True(arguments.ContainsKey((string)required), call.Name + " has its required '" + required + "': " + call.ArgumentsJson);
            foreach (var argument in arguments)
            {
                var property = properties.GetObject(argument.Key);
                Check.True(property != null, call.Name + " has no parameter '" + argument.Key + "': " + call.ArgumentsJson);
                var allowed = property.GetArray("enum");
                Check.True(allowed.Count == 0 || allowed.Contains(argument.Value), argument.Key + " is one of its enum: " + call.ArgumentsJson);
            }
            Console.WriteLine("TOOL_CALL " + call.Name + " " + call.ArgumentsJson);
        }

        static async Task CallsADeclaredTool()
        {
            JsonObject schemas;
            var tools = DeclaredTools(out schemas);
            Check.True(tools.Count >= 2, "pytest declares at least two tools");
            using (var client = Env.Client(Env.Token))
            {
                var guard = new NpcConversation(client, "guard-" + Guid.NewGuid().ToString("N"), "You are a town guard.")
                {
                    MaxTokens = 80,
                    Sampling = new SamplingParams { Temperature = 0 },
                };
                var act = await guard.ChooseActionAsync("A thief runs past you with a stolen purse!", tools, ToolChoice.Required);
                Check.Equal(FinishReason.ToolCall, act.FinishReason, "a call (the reply: " + act.Text + ")");
                Check.True(act.ToolCall != null && ReferenceEquals(act.ToolCall, act.Final.ToolCall), "the final chunk carries the call");
                CheckArguments(act.ToolCall, schemas);

                var named = tools[tools.Count - 1].Name;
                var forced = await guard.ChooseActionAsync("The thief draws a knife.", tools, ToolChoice.Function(named));
                Check.Equal(FinishReason.ToolCall, forced.FinishReason, "a call of the named tool");
                Check.Equal(named, forced.ToolCall.Name, "tool_choice names the tool called");
                CheckArguments(forced.ToolCall, schemas);

                // The game acts, then tells the NPC how it went; the NPC goes on in words, in its session.
                var pieces = new List<string>();
                var after = await guard.ToolResultAsync(forced.ToolCall, "{\"done\":true}", piece => pieces.Add(piece));
                Check.True(after.ToolCall == null && after.FinishReason != FinishReason.ToolCall, "words after the result: " + after.FinishReason);
                Check.True(after.Text.Trim().Length > 0 && string.Join("", pieces) == after.Text, "the words streamed: " + after.Text);
                Check.True(after.Usage.CachedPromptTokens >= forced.Usage.PromptTokens,
                    "the result continued the session (" + after.Usage.CachedPromptTokens + " tokens cached)");

                var e = await Check.Throws<SidecarException>(() => client.GenerateAsync(new GenerateRequest { Prompt = "Hi", Tools = tools }),
                    "tools with a raw prompt");
                Check.Equal(SidecarStatusCode.InvalidArgument, e.Code, "tools need chat messages");
                e = await Check.Throws<SidecarException>(() => guard.ChooseActionAsync("Dance!", tools, ToolChoice.Function("dance")),
                    "a tool_choice naming no tool");
                Check.True(e.Code == SidecarStatusCode.InvalidArgument && e.Message.Contains("dance"), "the refusal names it: " + e.Message);
                await guard.EndAsync();
            }
        }
    }
}
