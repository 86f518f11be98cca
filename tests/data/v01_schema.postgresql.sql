-- The v0.1 schema (sparseety 0.1.0: sniffer/store/models.py and tokens_store.py),
-- as v0.1's metadata.create_all emitted it for postgresql. Frozen: tests build a v0.1
-- database from it to check that it is recognised and upgraded in place.

CREATE TABLE choice_tokens (
	stream_id BIGINT NOT NULL, 
	choice INTEGER NOT NULL, 
	text_len INTEGER, 
	text_hash VARCHAR(32), 
	token_count INTEGER, 
	output_ids TEXT, 
	chunk_seqs TEXT, 
	chunk_counts TEXT, 
	straddles INTEGER, 
	straddle_seqs TEXT, 
	tokens_per_chunk TEXT, 
	server_count INTEGER, 
	server_tokens TEXT, 
	server_ids TEXT, 
	server_mismatch INTEGER, 
	PRIMARY KEY (stream_id, choice)
);

CREATE TABLE chunks (
	id BIGSERIAL NOT NULL, 
	stream_id BIGINT NOT NULL, 
	seq INTEGER NOT NULL, 
	choice INTEGER, 
	chunk_index INTEGER, 
	kind VARCHAR(16), 
	ts FLOAT, 
	text TEXT, 
	reasoning TEXT, 
	tool_calls TEXT, 
	finish_reason TEXT, 
	logprobs TEXT, 
	usage TEXT, 
	raw TEXT, 
	server_tokens TEXT, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_chunks_stream_seq ON chunks (stream_id, seq);

CREATE TABLE connections (
	id BIGINT NOT NULL, 
	client_ip VARCHAR(64), 
	client_port INTEGER, 
	server_ip VARCHAR(64), 
	server_port INTEGER, 
	opened_at FLOAT, 
	closed_at FLOAT, 
	close_reason VARCHAR(16), 
	syn_seen BOOLEAN, 
	capture VARCHAR(16), 
	pid INTEGER, 
	comm VARCHAR(64), 
	label TEXT, 
	PRIMARY KEY (id)
);

CREATE TABLE errors (
	id BIGSERIAL NOT NULL, 
	ts FLOAT, 
	stage VARCHAR(32), 
	kind VARCHAR(64), 
	message TEXT, 
	connection_id BIGINT, 
	stream_id BIGINT, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_errors_stream ON errors (stream_id);

CREATE TABLE meta (
	key VARCHAR(64) NOT NULL, 
	value TEXT, 
	PRIMARY KEY (key)
);

CREATE TABLE stream_tokens (
	stream_id BIGINT NOT NULL, 
	tokenizer TEXT, 
	is_default BOOLEAN, 
	prompt_count INTEGER, 
	prompt_ids TEXT, 
	output_count INTEGER, 
	usage_diff TEXT, 
	tokens_per_chunk TEXT, 
	anomaly_count INTEGER, 
	error TEXT, 
	PRIMARY KEY (stream_id)
);

CREATE TABLE streams (
	id BIGINT NOT NULL, 
	connection_id BIGINT, 
	exchange INTEGER, 
	label TEXT, 
	capture VARCHAR(16), 
	pid INTEGER, 
	comm VARCHAR(64), 
	client VARCHAR(80), 
	server VARCHAR(80), 
	method TEXT, 
	path TEXT, 
	dialect VARCHAR(64), 
	model TEXT, 
	is_stream BOOLEAN, 
	temperature FLOAT, 
	top_p FLOAT, 
	max_tokens BIGINT, 
	n INTEGER, 
	seed BIGINT, 
	prompt_len INTEGER, 
	request_json TEXT, 
	request_headers TEXT, 
	status INTEGER, 
	response_headers TEXT, 
	content_type TEXT, 
	streaming BOOLEAN, 
	t_request FLOAT, 
	t_response FLOAT, 
	t_first_content FLOAT, 
	t_last_chunk FLOAT, 
	state VARCHAR(16), 
	reason TEXT, 
	done_seen BOOLEAN, 
	gap BOOLEAN, 
	chunk_count INTEGER, 
	event_count INTEGER, 
	text_len BIGINT, 
	finish_reasons TEXT, 
	usage TEXT, 
	prompt_tokens BIGINT, 
	completion_tokens BIGINT, 
	response_body TEXT, 
	request_bytes BIGINT, 
	response_bytes BIGINT, 
	error TEXT, 
	closed_at FLOAT, 
	text_kept BOOLEAN, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_streams_connection ON streams (connection_id);

CREATE INDEX ix_streams_label_model ON streams (label, model);

CREATE INDEX ix_streams_state ON streams (state);

CREATE INDEX ix_streams_t_request ON streams (t_request);

CREATE TABLE token_anomalies (
	id BIGSERIAL NOT NULL, 
	stream_id BIGINT NOT NULL, 
	choice INTEGER, 
	kind VARCHAR(32), 
	position INTEGER, 
	detail TEXT, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_token_anomalies_kind ON token_anomalies (kind);

CREATE INDEX ix_token_anomalies_stream ON token_anomalies (stream_id);

INSERT INTO meta (key, value) VALUES ('schema_version', '1');
