-- A request answered 404 that named another tenant's resource is one row
-- per caller, owner and minute, with its count, as failed
-- authentications are per address and minute (issue 63: 301 requests
-- wrote 301 rows into the owner's trail). Rows written before are kept;
-- the rare two of one instant are made one first.
DELETE FROM audit WHERE kind = 'refused.other_tenant' AND EXISTS (
    SELECT 1 FROM audit o WHERE o.kind = 'refused.other_tenant' AND o.tenant = audit.tenant
      AND o.actor = audit.actor AND o.at = audit.at AND o.id < audit.id);
CREATE UNIQUE INDEX audit_refusals ON audit (tenant, actor, at) WHERE kind = 'refused.other_tenant';
