"""Pure translations between each REST protocol's JSON and the server's protobuf messages."""
