-- The one statement that ends a batch's turns (`event_log/postgres.rs`,
-- `finish_statement`). One array per column; a row of `f` per ending turn.
-- The sub-statements see one snapshot and cannot see each other's writes:
-- each writes a different table, and all but the plain events are
-- filtered by the turns `ended` returned.
--
-- Binds (`FINISH_BINDS` names them in this order; a test holds the two
-- together and checks each against its use below):
--   $1   f.turn_id         text[]
--   $2   f.session_id      text[]
--   $3   f.status          text[]
--   $4   f.result          text[]
--   $5   f.error_code      text[]
--   $6   f.error_message   text[]
--   $7   f.finished_at     timestamptz[]
--   $8   f.cost_usd        float8[]
--   $9   f.last_seq        int8[]
--   $10  m.message_id      text[]
--   $11  m.session_id      text[]
--   $12  m.turn_id         text[]
--   $13  m.role            text[]
--   $14  m.content         text[]
--   $15  m.created_at      timestamptz[]
--   $16  d.id              text[]
--   $17  d.session_id      text[]
--   $18  d.turn_id         text[]
--   $19  d.decision_key    text[]
--   $20  d.strategy        text[]
--   $21  d.record          text[]
--   $22  d.created_at      timestamptz[]
--   $23  e.session_id      text[]
--   $24  e.seq             int8[]
--   $25  e.turn_id         text[]
--   $26  e.type            text[]
--   $27  e.payload         text[]
--   $28  e.created_at      timestamptz[]
--   $29  e.terminal        bool[]
--   $30  o.id              text[]
--   $31  o.turn_id         text[]
--   $32  o.session_id      text[]
--   $33  o.source_id       text[]
--   $34  o.user_text       text[]
--   $35  o.assistant_text  text[]
--   $36  o.created_at      timestamptz[]
--   $37  j.id              text[]
--   $38  j.owner           text[]
--   $39  j.kind            text[]
--   $40  j.session_id      text[]
--   $41  j.turn_id         text[]
--   $42  j.payload         text[]
--   $43  j.at              timestamptz[]
--   $44  f.attempt         int4[]
--   $45  l.turn_id         text[]
--   $46  l.attempt         int4[]
--   $47  e.seq_end         int8[]
--   $48  r.id              text[]
--   $49  r.tenant          text[]
--   $50  r.session_id      text[]
--   $51  r.seq             int8[]
--   $52  r.turn_id         text[]
--   $53  r.kind            text[]
--   $54  r.created_at      timestamptz[]
--   $55  r.wanted          text[]
--   $56  r.terminal        bool[]
--   $57  m.attachments     text[]
WITH f AS (
  SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
  $6::text[], $7::timestamptz[], $8::float8[], $9::int8[], $44::int4[])
  AS f(turn_id, session_id, status, result, error_code, error_message, finished_at,
  cost_usd, last_seq, attempt)
), leased AS (
-- The batch's turns still held by the attempts that wrote it (the
-- sessions are locked: no take-over commits meanwhile).
  SELECT t.id FROM turns t JOIN unnest($45::text[], $46::int4[]) AS l(turn_id, attempt)
  ON t.id = l.turn_id AND t.attempt = l.attempt
), ended AS (
  UPDATE turns SET status = f.status, result = f.result, error_code = f.error_code,
  error_message = f.error_message, finished_at = f.finished_at, cost_usd = f.cost_usd
  FROM f WHERE turns.id = f.turn_id AND turns.status = 'running'
  AND turns.attempt = f.attempt
  RETURNING turns.id
), totals AS (
  UPDATE sessions SET updated_at = f.finished_at, last_seq = f.last_seq,
  cost_usd = COALESCE(sessions.cost_usd + f.cost_usd, sessions.cost_usd, f.cost_usd)
  FROM f JOIN ended ON ended.id = f.turn_id WHERE sessions.id = f.session_id
), said AS (
  INSERT INTO messages (message_id, session_id, turn_id, role, content, created_at,
  attachments)
  SELECT m.message_id, m.session_id, m.turn_id, m.role, m.content, m.created_at,
  m.attachments
  FROM unnest($10::text[], $11::text[], $12::text[], $13::text[], $14::text[],
  $15::timestamptz[], $57::text[]) WITH ORDINALITY
  AS m(message_id, session_id, turn_id, role, content, created_at, attachments, n)
  WHERE m.turn_id IN (SELECT id FROM ended) ORDER BY m.n
), decided AS (
  INSERT INTO decisions (id, session_id, turn_id, decision_key, strategy, record,
  created_at)
  SELECT * FROM unnest($16::text[], $17::text[], $18::text[], $19::text[],
  $20::text[], $21::text[], $22::timestamptz[])
  AS d(id, session_id, turn_id, decision_key, strategy, record, created_at)
  WHERE d.turn_id IN (SELECT id FROM ended)
), e AS (
  SELECT * FROM unnest($23::text[], $24::int8[], $25::text[], $26::text[],
  $27::text[], $28::timestamptz[], $29::bool[], $47::int8[])
  AS e(session_id, seq, turn_id, type, payload, created_at, terminal, seq_end)
), due AS (
  SELECT * FROM e WHERE NOT e.terminal OR e.turn_id IN (SELECT id FROM ended)
), stored AS (
  SELECT e.turn_id, e.terminal, e.turn_id IN (SELECT id FROM ended) AS due
  FROM e JOIN events x ON x.session_id = e.session_id AND x.seq = e.seq
  AND x.turn_id = e.turn_id AND x.type = e.type AND x.payload = e.payload
  AND x.seq_end IS NOT DISTINCT FROM e.seq_end
), logged AS (
  INSERT INTO events (session_id, seq, turn_id, type, payload, created_at, seq_end)
  SELECT session_id, seq, turn_id, type, payload, created_at, seq_end FROM due
  WHERE due.turn_id IN (SELECT id FROM leased)
  ON CONFLICT (session_id, seq) DO NOTHING RETURNING 1
), dropped AS (
  DELETE FROM turn_steps WHERE turn_id IN (SELECT id FROM ended)
), observed AS (
  INSERT INTO research_observations (id, session_id, source_id, user_text,
  assistant_text, created_at)
  SELECT o.id, o.session_id, o.source_id, o.user_text, o.assistant_text, o.created_at
  FROM unnest($30::text[], $31::text[], $32::text[], $33::text[], $34::text[],
  $35::text[], $36::timestamptz[])
  AS o(id, turn_id, session_id, source_id, user_text, assistant_text, created_at)
  WHERE o.turn_id IN (SELECT id FROM ended)
), queued AS (
  INSERT INTO background_jobs (id, kind, session_id, turn_id, payload, status,
  run_after, created_at, updated_at)
  SELECT j.id, j.kind, j.session_id, j.turn_id, j.payload, 'pending', j.at, j.at, j.at
  FROM unnest($37::text[], $38::text[], $39::text[], $40::text[], $41::text[],
  $42::text[], $43::timestamptz[])
  AS j(id, owner, kind, session_id, turn_id, payload, at)
  WHERE j.owner IN (SELECT id FROM ended)
), routed AS (
-- The webhook messages of the events written here: a turn's end with its
-- end, a wait with its (leased) turn's events.
  INSERT INTO webhook_deliveries (id, webhook_id, tenant, session_id, seq, kind,
  created_at, next_at, share_key)
  SELECT r.id, w.id, r.tenant, r.session_id, r.seq, r.kind, r.created_at, r.created_at,
  CASE WHEN w.tenant = '*' THEN '*' ELSE r.tenant END
  FROM unnest($48::text[], $49::text[], $50::text[], $51::int8[], $52::text[],
  $53::text[], $54::timestamptz[], $55::text[], $56::bool[])
  AS r(id, tenant, session_id, seq, turn_id, kind, created_at, wanted, terminal)
  JOIN webhooks w ON (w.tenant = '*' OR w.tenant = r.tenant)
  AND position(r.wanted IN w.events) > 0
  WHERE r.turn_id IN (SELECT id FROM leased)
  AND (NOT r.terminal OR r.turn_id IN (SELECT id FROM ended))
  ON CONFLICT DO NOTHING
)
SELECT ARRAY(SELECT id FROM ended
  UNION SELECT turn_id FROM stored WHERE terminal),
  harness_event_conflicts((SELECT count(*) FROM due)
  - (SELECT count(*) FROM logged)
  - (SELECT count(*) FROM stored WHERE NOT terminal OR due))
-- A session's first row of the batch at or before what the session holds,
-- and not stored as it is: refused, as the plain insert refuses it (the
-- key sees a run's first seq only, so a run that starts inside a stored
-- one would not collide).
  + harness_event_conflicts((SELECT count(*) FROM
      (SELECT DISTINCT ON (session_id) * FROM due ORDER BY session_id, seq) AS f
    WHERE (SELECT COALESCE(x.seq_end, x.seq) FROM events x
           WHERE x.session_id = f.session_id ORDER BY x.seq DESC LIMIT 1) >= f.seq
    AND NOT EXISTS (SELECT 1 FROM events x WHERE x.session_id = f.session_id
      AND x.seq = f.seq AND x.turn_id = f.turn_id AND x.type = f.type
      AND x.payload = f.payload AND x.seq_end IS NOT DISTINCT FROM f.seq_end)))
