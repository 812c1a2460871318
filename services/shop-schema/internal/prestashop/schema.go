package prestashop

import (
	"context"
	"net/url"

	"golang.org/x/sync/errgroup"
)

// Field lists asked for with display=[...]: only what the service returns,
// which keeps pages small (category descriptions can be long). Every field
// exists in 1.7, 8 and 9.
const (
	categoryFields = "[id,id_parent,level_depth,active,position,is_root_category,name]"
	featureFields  = "[id,position,name]"
	valueFields    = "[id,id_feature,custom,value]"
)

// The resources read, each with its own GET permission on the shop's key.
const (
	resourceLanguages     = "languages"
	resourceCategories    = "categories"
	resourceFeatures      = "product_features"
	resourceFeatureValues = "product_feature_values"
)

// permissionsNeeded names every permission a key needs, for the answer to
// a key lacking one: the shop names only the first resource refused, and a
// merchant who ticks that one box would otherwise learn the next one call
// by call.
const permissionsNeeded = "the key needs GET on " + resourceCategories + ", " + resourceFeatures + " and " +
	resourceFeatureValues + ", and on " + resourceLanguages + " for names in every language"

// Schema is what a shop returned, as the shop shaped it.
type Schema struct {
	Version    string // PSWS-Version header, when the shop sent one
	Languages  []Language
	Categories []Category
	Features   []Feature
	Values     []FeatureValue // shared values only (custom = 0)
	// LanguagesDenied is set when the key may not read languages; the
	// schema is still returned, without per-language names.
	LanguagesDenied bool
}

// ReadSchema reads languages, categories, features and shared feature values
// of the shop at base concurrently. key is used as the webservice key for
// these requests and kept nowhere else. The first failure cancels the other
// reads and is returned as an *Error.
func (cl *Client) ReadSchema(ctx context.Context, base *url.URL, key string) (*Schema, error) {
	c := &call{base: base, key: key}
	c.bytesLeft.Store(cl.maxCallBytes)
	s := &Schema{}
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		langs, err := listAll(ctx, cl, c, resourceLanguages, "full", "", func(l Language) Int { return l.ID })
		if e, ok := err.(*Error); ok && e.resourceRefused() {
			// The key lacks the languages permission only; the other
			// resources decide whether the key works at all.
			s.LanguagesDenied = true
			return nil
		}
		s.Languages = langs
		return err
	})
	g.Go(func() (err error) {
		s.Categories, err = listAll(ctx, cl, c, resourceCategories, categoryFields, "", func(x Category) Int { return x.ID })
		return err
	})
	g.Go(func() (err error) {
		s.Features, err = listAll(ctx, cl, c, resourceFeatures, featureFields, "", func(x Feature) Int { return x.ID })
		return err
	})
	g.Go(func() error {
		// filter[custom]=0 keeps the per-product custom values, which can
		// number one per product, on the shop's side.
		values, err := listAll(ctx, cl, c, resourceFeatureValues, valueFields, "&filter[custom]=0",
			func(x FeatureValue) Int { return x.ID })
		for _, v := range values {
			if !v.Custom {
				s.Values = append(s.Values, v)
			}
		}
		return err
	})
	if err := g.Wait(); err != nil {
		return nil, err
	}
	if v, ok := c.version.Load().(string); ok {
		s.Version = v
	}
	return s, nil
}
