//! GitLab's ID scalars (carried as their global-ID text) and `JSON`.

use juniper::GraphQLScalar;

macro_rules! id_scalar {
    ($rust:ident, $name:literal) => {
        #[derive(Debug, Clone, PartialEq, GraphQLScalar)]
        #[graphql(name = $name, transparent)]
        pub struct $rust(pub String);
    };
}

id_scalar!(AiModelId, "AiModelID");
id_scalar!(AiAgentVersionId, "AiAgentVersionID");
id_scalar!(AiConversationThreadId, "AiConversationThreadID");
id_scalar!(ProjectId, "ProjectID");
id_scalar!(NamespaceId, "NamespaceID");
id_scalar!(GroupId, "GroupID");
id_scalar!(UserId, "UserID");
id_scalar!(Time, "Time");
id_scalar!(AiSelfHostedModelId, "AiSelfHostedModelID");
// Arbitrary JSON, carried as its serialised text.
id_scalar!(Json, "JSON");
